"""Strategies: where the padded Q lives (placement: a :class:`StrategyKind` of :data:`KINDS`, one module of
:mod:`mla_lab.model.strategy_kinds` each) x what its padded heads hold (content) x the route rule it runs under. A
:class:`Strategy` is one typed value, parsed once at the door (:func:`expand`); ``docs/glossary.md`` describes each
placement. Canonical names: :func:`canonical_names`, each optionally ``@<rule>``; door names: :data:`PRESETS`,
:data:`ALIASES`, engine versions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .engines import (
    ENGINE_PRESETS,
    decode_threshold,
    engine_preset,
    padding_for,
    preset_of_rule,
    resolve_engine,
    sparse_backend,
)
from .labels import KERNEL_NATIVE_LABEL, SGLANG_DENSE_LABEL, SGLANG_DENSE_NOTE
from .routes import RULE_ALIASES, model_family, route_for, rules

__all__ = ["MEASURED_STRATEGIES", "SERVE_PRESETS", "Strategy", "StrategyKind", "register_kind", "LAYOUTS", "CONTENTS",
           "PRESETS", "ALIASES", "PRESET_SOURCES", "parse_strategy", "as_strategy", "expand", "expand_strategies",
           "resolve_strategy", "preset_of", "LEGACY_MEASURED", "measured_as", "BASELINE", "PR_STRATEGY",
           "SUBCHUNK_ROWS", "canonical_names", "fixed_strategies", "SWEEP_STRATEGIES", "TIMED_STRATEGIES",
           "real_strategies", "advise_candidates", "SEED_COMPARISONS", "BENCH_PRESET_LABELS", "strategy_route",
           "SUBCHUNK_GRAPH", "engine_members", "engine_strategies", "today_engines", "resolve_engine", "engine_summary",
           "engine_table", "PR_TRADE_BY_ENGINE", "FORCED_TODAY", "PRESET_LABELS", "STRATEGY_NOTES", "preset_label",
           "strategy_notes", "KINDS"]

CONTENTS = ("zeros", "stale")
#: Sub-chunk sizes the sweep prices by default (rows of the padded workspace).
SUBCHUNK_ROWS = (1024, 2048, 4096, 8192)
#: Q layouts: ``per_call`` (pad + copy per call), ``workspace`` (a padded workspace the concat writes), ``real``.
LAYOUTS = ("per_call", "workspace", "real")


@dataclass(frozen=True)
class Strategy:
    """One way to feed the kernel its padded heads (a value: two equal values price the same).

    Attributes:
        placement: a name of :data:`KINDS`; content: what the padded heads hold (:data:`CONTENTS`).
        zero_policy: pre-padded workspaces only (``zero_once``, ``zero_per_call``, ``none``); rows: ``subchunk``'s S.
        handoff: ``subchunk``: ``copy``, ``views`` (the consumer runs per chunk) or ``graph2`` (two S-row workspaces on
            two streams in one CUDA graph).
        route_rule: a generic rule other than the placement's default; engine: the engine version whose rule it runs
            under; overlap: ``packed``'s assumed top-k overlap (None: the default).
    """

    placement: str
    content: str
    zero_policy: str | None = None
    rows: int | None = None
    handoff: str | None = None
    route_rule: str | None = None
    overlap: float | None = None
    engine: str | None = None

    #: Its :class:`StrategyKind` (:data:`KINDS`).
    kind = property(lambda self: KINDS[self.placement])

    @property
    def rule(self) -> str | None:
        """The route rule in force (None: always ``sparse-mqa``)."""
        if self.engine:
            return engine_preset(self.engine).rule.name
        return self.route_rule or self.kind.rule

    #: The release of :attr:`engine` (``vllm@0.33.0-flashmla`` -> ``vllm@0.33.0``), else None.
    engine_release = property(lambda self: engine_preset(self.engine).engine_version.name if self.engine else None)
    #: FlashMLA gets a head-padded Q (layout not ``real``).
    padded = property(lambda self: self.kind.layout != "real")
    views_handoff = property(lambda self: self.handoff in ("views", "graph2"))
    #: Q-concat workspaces held (2 for ``subchunk:<S>:graph2``).
    workspaces = property(lambda self: 2 if self.handoff == "graph2" else 1)
    graphed = property(lambda self: self.handoff == "graph2")
    #: The padded Q is a workspace the concat writes into (no per-call pad).
    pre_padded = property(lambda self: self.kind.layout == "workspace")
    #: A pad tensor is allocated and the real heads copied in on every layer call.
    per_call_pad = property(lambda self: self.kind.layout == "per_call")
    concat_zeroes_padding = property(lambda self: self.zero_policy == "zero_per_call")

    @property
    def name(self) -> str:
        """The canonical name (:func:`parse_strategy` round-trips it)."""
        base = self.kind.label(self) if self.kind.label else self.placement
        return base + (f"@{self.rule}" if self.engine or self.route_rule else "")

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class StrategyKind:
    """A placement, declared beside its pricing by one module of :mod:`mla_lab.model.strategy_kinds` (``KIND``).

    Attributes:
        order: its place in :data:`KINDS`; rule: default route rule (None: always ``sparse-mqa``); layout:
            :data:`LAYOUTS`; decode: its decode rows' kernel family (:data:`mla_lab.model.decode_kernels.FAMILIES`).
        price: ``(rank, strategy, T, sum_topk, step) -> list[LayerOp]``, one layer's attention-path ops.
        fixed: its values without a parameter; parse: ``<placement>:<params>`` -> Strategy (raises ValueError);
            patterns: the names :func:`canonical_names` lists for it; label: a value's name before ``@`` (None: the
            placement); extra_bytes: ``(rank, prompt_len) -> int`` persistent bytes beside the Q buffer.
        memory: ``(strategy, shape: mla_lab.buffers.QShape) -> dict``, bytes that differ from its layout's account
            (keys ``persistent``, ``transient``, ``q_heads``, ``kernel_heads``, ``kernel_out``; None: the layout's).
        shown: ``advise``'s section for it (None: ranked; ``lab``: beside an engine's answer; ``modelled_only``:
            shown, never ranked); display: the label outputs print; notes: the line printed beside it (where it
            was measured, then elsewhere: :func:`strategy_notes` prints the first).
    """

    placement: str
    order: int
    rule: str | None
    layout: str
    decode: str
    price: Callable
    fixed: tuple[Strategy, ...] = ()
    parse: Callable[[str], Strategy] | None = None
    patterns: tuple[str, ...] = ()
    label: Callable[[Strategy], str] | None = None
    extra_bytes: Callable | None = None
    memory: Callable | None = None
    shown: str | None = None
    display: str | None = None
    notes: tuple[str, ...] = ()


#: placement -> :class:`StrategyKind`, in ``order`` (filled by :mod:`mla_lab.model.strategy_kinds` on
#: ``import mla_lab``; live: :func:`register_kind` adds to it).
KINDS: dict[str, StrategyKind] = {}


def register_kind(kind: StrategyKind) -> StrategyKind:
    """Add one strategy kind; returns it. Raises ValueError: a placement or fixed name already held (or a fixed
    value of another placement), a layout not in :data:`LAYOUTS`, an unknown rule."""
    if not isinstance(kind, StrategyKind) or kind.layout not in LAYOUTS:
        raise ValueError(f"kind={kind!r} must be a StrategyKind with layout in {list(LAYOUTS)}")
    if kind.rule is not None and kind.rule not in rules():
        raise ValueError(f"strategy kind {kind.placement!r}: rule {kind.rule!r} is not known; allowed: {list(rules())}")
    names = {kind.label(st) if kind.label else kind.placement for st in kind.fixed}
    clash = sorted(({kind.placement} & set(KINDS)) | (names & set(_fixed())))
    if clash or any(st.placement != kind.placement for st in kind.fixed):
        raise ValueError(f"strategy kind {kind.placement!r}: {clash or 'a fixed value of another placement'} "
                         "already taken")
    items = sorted([*KINDS.values(), kind], key=lambda k: (k.order, k.placement))
    KINDS.clear()
    KINDS.update((k.placement, k) for k in items)
    return kind


def _fixed() -> dict[str, Strategy]:
    """Every kind's fixed values by canonical name."""
    return {st.name: st for k in KINDS.values() for st in k.fixed}


#: Strategy presets -> canonical strategies (two names: the range the engine can be in); the PR-era door names.
PRESETS = {
    "vllm-pre-53878": ("per_call_empty:zeros", "per_call_empty:stale"),
    "vllm-53878": ("private_workspace",),
    "vllm-56902": ("shared_workspace:none",),
    "vllm-fa3-sparse": ("fa3_sparse",),
    "sglang-dense": ("per_call_zeros@sglang-dense",),
    "sglang-flashmla-sparse": ("per_call_zeros",),
    "kernel-native": ("kernel_native",),
}
#: Where each strategy preset's behaviour is written down.
PRESET_SOURCES = {
    "vllm-pre-53878": "vLLM main in mid-2026, the path PR #53878 replaced (vllm/v1/attention/backends/mla/"
                      "flashmla_sparse.py at the PR's merge-base): __init__ takes a private (max_num_batched_tokens, "
                      "num_heads, 576) workspace view, forward_mqa runs concat_mla_q into it, _forward_bf16_kv passes "
                      "topk_length, _bf16_flash_mla_kernel pads with q.new_empty((T, prefill_padding, 576)) + slice "
                      "copy (logger.warning_once); padded heads hold the caching allocator's block (zeros if only the "
                      "pad used it, else stale). Not the older stored file 60191e18 (torch.cat, no topk_length)",
    "vllm-53878": "vLLM PR #53878 (merged on or after 2026-08-27; its memory figures were added that day), "
                  "flashmla_sparse.py: pre-padded Q-concat workspace, constructor-time view, never written (fresh "
                  "memory: zeros); --attention-backend FLASHMLA_SPARSE",
    "vllm-56902": "vLLM PR #56902 (merged 2026-09-14), flashmla_sparse.py: the padded Q-concat view taken per call "
                  "at offset 0 of the workspace shared with fused-MoE and indexer scratch (stale padded heads); no "
                  "separate unpadded Q buffer remains, so its persistent extra over the pre-PR engine is minus that "
                  "buffer when the shared workspace is larger (GLM-5 TP8, 16384: -144 MiB)",
    "vllm-fa3-sparse": "vLLM FLASH_ATTN_MLA_SPARSE (PR #46189, merged 2026-06-19; "
                       "vllm/v1/attention/backends/mla/flashattn_mla_sparse.py, read at 0299fca7): FA3 varlen, "
                       "q=q_rope, q_v=q_nope, max_seqlen_q=1, block_table=top-k indices, real heads; vLLM's sm90 "
                       "default for head size 576 (ahead of FLASHMLA_SPARSE in the sparse priority list, vLLM issue "
                       "#56564); no concat, no padded Q, no padded output",
    "sglang-dense": "SGLang's documented dense route with its prefill CUDA graphs off (not SGLang 0.5.23's H200 "
                    "default: that runs prompts of <= 8192 tokens inside breakable prefill CUDA graphs, where the "
                    "dense route is off, on padded flashmla_sparse with new_zeros; engine preset sglang@0.5.23) "
                    "(sgl-project/sglang docs/basic_usage/deepseek_v32.md at 7bc99464, PR "
              "#12868; dsa_backend.py, PR #11892): prefills of <= 2048 tokens dense MHA (FlashAttention varlen, "
              "MHA_ONE_SHOT), longer prefills flashmla_sparse (_forward_flashmla_sparse: q_all.new_zeros(...) + "
              "copy per call), decode fa3",
    "sglang-flashmla-sparse": "SGLang with flashmla_sparse forced for every prefill and decode "
                              "(_forward_flashmla_sparse: q_all.new_zeros(...) + copy per call)",
    "kernel-native": "modelled (real-head FlashMLA): a FlashMLA-style kernel taking the real head count (concat "
                     "into an H-head buffer; no padded Q, no padded output); no engine's backend runs one; vLLM's "
                     "FLASH_ATTN_MLA_SPARSE (preset vllm-fa3-sparse) is the shipping real-head kernel on sm90, and "
                     "vLLM 0.33.0's FlashMLA run with h_q = 8 measured slower than padded to 64 "
                     "(data/measured/h200/between_process/engine_kernels.csv)",
}
#: How outputs label a preset whose name alone would mislead (:mod:`mla_lab.labels`).
PRESET_LABELS = {"sglang-dense": SGLANG_DENSE_LABEL, "kernel-native": KERNEL_NATIVE_LABEL}
#: The line an output prints under a table holding these strategies (:func:`strategy_notes`; a kind's own: its
#: ``notes``).
STRATEGY_NOTES = {"per_call_zeros@sglang-dense": SGLANG_DENSE_NOTE}


def preset_label(preset: str) -> str:
    """The label outputs print for a preset (:data:`PRESET_LABELS`, an engine version's ``label``, else the name)."""
    if preset in ENGINE_PRESETS:
        return ENGINE_PRESETS[preset].label or preset
    return PRESET_LABELS.get(preset, preset)


def strategy_notes(strategies) -> list[str]:
    """The kinds' first ``notes`` (``packed:<overlap>`` has ``packed``'s), then :data:`STRATEGY_NOTES`, of the
    ``strategies`` present, once each."""
    names = {str(s) for s in strategies}
    kinds = {n.partition(":")[0] for n in names}
    return [k.notes[0] for k in KINDS.values() if k.notes and k.placement in kinds] + [
        note for s, note in STRATEGY_NOTES.items() if s in names]


_MEMBERS: dict = {}  # preset name -> (its record, its members as values): each record's names parsed once


def engine_members(engine: str) -> list[Strategy]:
    """An engine version's ``members`` under its route rule. Raises ValueError as :func:`resolve_engine`."""
    p = engine_preset(engine)
    if _MEMBERS.get(p.name, (None,))[0] is not p:
        owner = preset_of_rule(p.rule.name) is p
        sts = [_parse(base) for base in p.members]
        _MEMBERS[p.name] = p, [st if p.rule.name == st.kind.rule else
                               replace(st, engine=p.name) if owner else replace(st, route_rule=p.rule.name)
                               for st in sts]
    return list(_MEMBERS[p.name][1])


def engine_strategies(engine: str) -> list[str]:
    """:func:`engine_members` as canonical names."""
    return [s.name for s in engine_members(engine)]


def today_engines() -> list[str]:
    """The engine versions answered beside every ``advise`` (records with ``today``)."""
    return [p.name for p in ENGINE_PRESETS.values() if p.today]


#: The first version's names, kept for existing parameter files and data.
ALIASES = {"unfused": "vllm-pre-53878", "fused": "vllm-53878", "sglang": "sglang-dense"}
#: What the first version's *measurements* labelled ``unfused`` / ``fused`` ran.
LEGACY_MEASURED = {"unfused": "per_call_zeros", "fused": "private_workspace"}


def measured_as(name: str) -> str:
    """The canonical strategy a measured row's label stands for (:data:`LEGACY_MEASURED`, else
    :func:`resolve_strategy`)."""
    return LEGACY_MEASURED.get(name) or resolve_strategy(name)


#: The row every TTFT change is taken against: vLLM before the PR with zero padded heads.
BASELINE = "per_call_empty:zeros"


def _with_rule(st: Strategy, rule: str, name: str) -> Strategy:
    rule = RULE_ALIASES.get(rule, rule)
    if rule == st.kind.rule:
        return st
    owner = preset_of_rule(rule)
    if owner is not None:
        return replace(st, engine=owner.name)
    if rule not in rules():
        raise ValueError(f"strategy={name!r}: route rule {rule!r} is not known; allowed: {list(rules())}")
    return replace(st, route_rule=rule)


def _parse(name: str) -> Strategy:
    base, _, rule = name.partition("@")
    head, colon, _ = base.partition(":")
    fixed, kind = _fixed(), KINDS.get(head)
    if base in fixed:
        st = fixed[base]
    elif colon and kind and kind.parse:
        st = kind.parse(base)
    elif name in PRESETS or name in ALIASES or name == "kernel-native" or name in ENGINE_PRESETS:
        raise ValueError(f"strategy={name!r} is a preset or alias, read only at the door (parameters, CLI, legacy "
                         f"rows: mla_lab.placement.expand / resolve_strategy); allowed here: {canonical_names()}")
    else:
        raise ValueError(f"strategy={name!r} is not known; allowed: {canonical_names()}, presets {list(PRESETS)}, "
                         f"engine presets {list(ENGINE_PRESETS)} or aliases {list(ALIASES)}")
    return _with_rule(st, rule, name) if rule else st


def parse_strategy(name: str) -> Strategy:
    """A canonical name -> :class:`Strategy` (a Strategy as it is; presets and aliases: :func:`expand`).
    Raises ValueError: an unknown name, a bad parameter (``subchunk:<S>``, ``packed:<overlap>``), an unknown rule."""
    if isinstance(name, Strategy):
        return name
    if not isinstance(name, str):
        raise ValueError(f"strategy={name!r} must be a str or a Strategy; allowed: {canonical_names()}")
    return _parse(name)


#: A :class:`Strategy` as it is; a canonical name parsed (:func:`parse_strategy` itself).
as_strategy = parse_strategy


def canonical_names() -> list[str]:
    """Every fixed canonical name plus the patterns."""
    return [*_fixed(), *(p for k in KINDS.values() for p in k.patterns), "<name>@<rule>"]


_PRESET_VALUES: dict = {}


def _door(n) -> list[Strategy]:
    if isinstance(n, Strategy):
        return [n]
    n = ALIASES.get(n, n)
    n = "kernel-native" if n == "kernel_native" else n
    if n in PRESETS:
        if n not in _PRESET_VALUES:  # each preset's names parsed once
            _PRESET_VALUES[n] = [_parse(m) for m in PRESETS[n]]
        return list(_PRESET_VALUES[n])
    if n in ENGINE_PRESETS:
        return engine_members(n)
    return [parse_strategy(n)]


def expand(names) -> list[Strategy]:
    """The door: presets, aliases, engine versions, canonical names or values (a str is one name) -> values,
    order kept, duplicates dropped. Raises ValueError as :func:`parse_strategy`."""
    if isinstance(names, (str, Strategy)):
        names = [names]
    out = {}
    for n in dict.fromkeys(names):  # a name given twice is read once
        for st in _door(n):
            out.setdefault(st.name, st)
    return list(out.values())


def expand_strategies(names) -> list[str]:
    """:func:`expand` as canonical names (the form rows and CSV columns carry)."""
    return [s.name for s in expand(names)]


def resolve_strategy(name) -> str:
    """One canonical name for any door name (a preset's first member). Raises ValueError as :func:`parse_strategy`."""
    return _door(name)[0].name


def preset_of(name: str) -> str:
    """The strategy preset (or else engine preset) a canonical strategy belongs to ("" for the lab's own)."""
    for preset, members in PRESETS.items():
        if name in members:
            return preset
    return next((p for p in ENGINE_PRESETS if name in engine_strategies(p)), "")


#: vLLM PR #53878's strategy: the pre-padded private workspace.
PR_STRATEGY = "private_workspace"


def fixed_strategies() -> list[str]:
    """Every fixed canonical name (``subchunk:<S>`` takes any positive S and is not listed)."""
    return list(_fixed())


#: The sub-chunk strategy measured fastest (H200, 5 fresh processes, ``subgraph.csv``; issue 23).
SUBCHUNK_GRAPH = "subchunk:2048:graph2"

#: The sweep's default ``strategies`` parameter (door names).
SWEEP_STRATEGIES = (*PRESETS, "shared_workspace:zero_per_call", *(f"subchunk:{s}" for s in SUBCHUNK_ROWS),
                    *(f"subchunk:{s}:views" for s in SUBCHUNK_ROWS), *(f"subchunk:{s}:graph2" for s in SUBCHUNK_ROWS),
                    "packed")

#: Measured by default on a GPU (:mod:`mla_lab.measure.attention`).
MEASURED_STRATEGIES = ("per_call_empty:zeros", "per_call_empty:stale", "private_workspace", "shared_workspace:none",
                       "shared_workspace:zero_per_call", "per_call_zeros", "subchunk:4096")
#: ``mla-lab measure``'s ``attention_strategies`` default (``data/measured/h200/between_process/strategies.csv``).
TIMED_STRATEGIES = ("per_call_empty:zeros", "private_workspace", "subchunk:2048:graph2", "subchunk:4096:graph2",
                    "subchunk:2048:views")
#: ``mla-lab serve``'s default presets: vLLM before PR #53878, at it, after PR #56902.
SERVE_PRESETS = ("vllm-pre-53878", "vllm-53878", "vllm-56902")


def __getattr__(name: str) -> tuple:
    """Names read from :data:`KINDS` when asked (it fills after this module): ``SEED_STRATEGIES``, what the seed's
    model comparison prices (:func:`mla_lab.model.ttft.compare_strategies`); ``EXPLORER_STRATEGIES``, what the
    explorer prices. Raises AttributeError: any other name."""
    if name == "SEED_STRATEGIES":
        return tuple(expand_strategies([*PRESETS, "shared_workspace:zero_per_call",
                                        *(f"subchunk:{s}" for s in SUBCHUNK_ROWS), SUBCHUNK_GRAPH]))
    if name == "EXPLORER_STRATEGIES":
        return (*_fixed(), "subchunk:4096", "subchunk:4096:views")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def real_strategies(subchunk_rows=(1, 5, 64)) -> list[str]:
    """Every strategy that runs on tensors: the presets' padded members, ``shared_workspace:zero_per_call``,
    ``subchunk:<S>`` for ``subchunk_rows`` (the last also ``:views``, the middle ``:graph2``)."""
    names = [s.name for s in expand(list(PRESETS)) if s.padded and s.route_rule is None and s.engine is None]
    names += ["shared_workspace:zero_per_call"] + [f"subchunk:{s}" for s in subchunk_rows]
    names += [f"subchunk:{subchunk_rows[-1]}:views", f"subchunk:{subchunk_rows[len(subchunk_rows) // 2]}:graph2"]
    return list(dict.fromkeys(names))


def advise_candidates(max_num_batched_tokens: int) -> list[str]:
    """What ``mla-lab advise`` weighs: the presets' members, ``shared_workspace:zero_per_call`` and ``subchunk:S``
    (plain, ``:views``, ``:graph2``) for S = 512, 1024, ... below ``max_num_batched_tokens``."""
    names = expand_strategies(list(PRESETS) + ["shared_workspace:zero_per_call"])
    s = 512
    while s < max_num_batched_tokens:
        names += [f"subchunk:{s}", f"subchunk:{s}:views", f"subchunk:{s}:graph2"]
        s *= 2
    return names


#: The lab's proposals ``mla-lab advise`` also prices on vLLM 0.33.0's routes with FLASHMLA_SPARSE forced.
FORCED_TODAY = ("per_call_empty:zeros", "private_workspace", "subchunk:2048:graph2")

#: (label, strategy, against) of the seed answer (:mod:`mla_lab.report.seed_answer`).
SEED_COMPARISONS = (
    ("vLLM #53878 vs vLLM before it, padded heads zeros", "private_workspace", "per_call_empty:zeros"),
    ("vLLM #53878 vs vLLM before it, padded heads stale", "private_workspace", "per_call_empty:stale"),
    ("vLLM #56902 (shared workspace, stale) vs vLLM #53878", "shared_workspace:none", "private_workspace"),
    ("SGLang, flashmla_sparse forced (new_zeros per call) vs vLLM #53878", "per_call_zeros", "private_workspace"),
    ("SGLang dense route, prefill graphs off (dense MHA <= 2048 tokens) vs vLLM #53878", "per_call_zeros@sglang-dense",
     "private_workspace"),
    ("vLLM FA3 sparse (Hopper default, real heads) vs vLLM #53878", "fa3_sparse", "private_workspace"),
    ("vLLM #53878 vs a new_zeros pad per call (the lab's first baseline)", "private_workspace", "per_call_zeros"),
)

#: (label, strategy, against, engine) of the PR's trade by engine version
#: (:func:`mla_lab.report.seed_answer.pr_trade_by_engine`).
PR_TRADE_BY_ENGINE = (
    ("as it was: the PR's build vs vLLM before it (FLASHMLA_SPARSE forced)", "private_workspace",
     "per_call_empty:zeros", "vllm@pr53878"),
    ("as it is in vLLM 0.33.0, FLASHMLA_SPARSE forced: the PR's workspace (shared view) vs a per-call pad",
     "shared_workspace:none@vllm-0.33.0-flashmla", "per_call_empty:zeros@vllm-0.33.0-flashmla", "vllm@0.33.0-flashmla"),
    ("vLLM 0.33.0 without the forced backend: FA3 sparse (real heads) vs FLASHMLA_SPARSE forced",
     "fa3_sparse@vllm-0.33.0", "shared_workspace:none@vllm-0.33.0-flashmla", "vllm@0.33.0"),
)

#: ``preset`` labels of ``benchmarks/bench_engines.py`` rows -> canonical strategies (a door for those files).
BENCH_PRESET_LABELS = {"per_call_empty_zeros": "per_call_empty:zeros", "per_call_empty_stale": "per_call_empty:stale",
                       "per_call_zeros": "per_call_zeros", "private_workspace_zeros": "private_workspace",
                       "shared_workspace_stale": "shared_workspace:none",
                       "shared_workspace_zero_per_call": "shared_workspace:zero_per_call"}


def strategy_route(strategy, model_name, topk: int, seq_lens=None, query_lens=None, phase: str = "prefill",
                   num_heads: int | None = None) -> str:
    """The route ``strategy`` takes for a batch (:func:`mla_lab.routes.route_for` under its rule; no rule:
    ``sparse-mqa``). Raises ValueError as :func:`as_strategy` and ``route_for``."""
    st = as_strategy(strategy)
    if st.rule is None:
        return "sparse-mqa"
    return route_for(st.rule, model_name, topk, phase, seq_lens, query_lens, num_heads).route


_BACKEND_LABELS = {"FLASH_ATTN_MLA_SPARSE": "FA3 sparse", "FLASH_ATTN_MLA_SPARSE_FA4": "FA4 sparse",
                   "FLASHINFER_MLA_SPARSE": "FlashInfer sparse", "FLASHMLA_SPARSE": "FlashMLA sparse",
                   "FLASHINFER_MLA_SPARSE_SM90": "FlashInfer sparse (sm90)"}


def _padded_path(backend: str, pad: int, num_heads: int, prefill_route: str, decode_route: str) -> str:
    """Where the padded FlashMLA kernel runs, in words."""
    label = _BACKEND_LABELS.get(backend, backend)
    where = [w for w, r in (("prefill rows", prefill_route), ("decode rows", decode_route))
             if pad and r == "sparse-mqa"]
    if not where:
        return (f"nowhere: {label} takes the real {num_heads} heads" if not pad else
                "nowhere at this prompt length (prefill rows dense MHA, decode rows another backend)")
    text = " and ".join(where) + f" ({label}, heads padded {num_heads} -> {-(-num_heads // pad) * pad})"
    return text + ("; prefill rows dense MHA" if where == ["decode rows"] and prefill_route == "mha-dense" else "")


def _decode(p, backend: str, sm: str, kv: str, num_heads: int) -> tuple[str, int, bool]:
    """``(decode_route, threshold, uniform)`` of a preset's decode rows: on its ``decode_backend`` (else the
    prefill's), padded -> ``sparse-mqa``, else ``fa3-sparse``; the threshold from its facts, else its rule's."""
    dec = p.decode_backend or backend
    try:
        thr, uniform = decode_threshold(p.name, dec, sm, num_heads)
    except ValueError:
        thr, uniform = p.rule.decode_threshold(num_heads), p.rule.uniform_decodes
    return ("sparse-mqa" if padding_for(p.name, dec, sm, kv) else "fa3-sparse"), thr, uniform


def engine_summary(engine: str, deployment) -> dict:
    """What engine version ``engine`` (a preset or first name) does for a checked ``deployment``, from its record
    (a code reading): the first step holds ``min(num_prompts x prompt_len, budget)`` fresh-prompt tokens, the budget
    ``max_num_batched_tokens`` capped by the rule's prefill-graph size (SGLang's H200 ``chunked_prefill_size``).
    Returns ``{preset, engine, version, release_date, backend, padding (0: real heads), prefill_route,
    prefill_reason, decode_route, decode_threshold, uniform_decodes, padded_path, models, supported, sources, scope,
    note}``. Raises ValueError: a bad engine name (one line, the allowed values)."""
    d = deployment
    model, num_heads, sm, kv_cache_dtype = d.model, d.num_heads, d.arch.sm, d.kv_cache_dtype
    prompt_len, max_num_batched_tokens = d.prompt_len, d.max_num_batched_tokens
    p = engine_preset(engine)
    ev, fam = p.engine_version, model_family(model)
    out = {"preset": p.name, "engine": ev.engine, "version": ev.version, "release_date": ev.release_date,
           "models": list(ev.models), "supported": fam in ev.models, "sources": p.sources,
           "scope": "modelled from the engine's source (a code reading, not run)"}
    try:
        backend = sparse_backend(p.name, sm, kv_cache_dtype, num_heads)
    except ValueError as e:
        return {**out, "backend": None, "padding": None, "prefill_route": None, "prefill_reason": str(e),
                "decode_route": None, "decode_threshold": None, "uniform_decodes": None, "padded_path": "-"}
    pad = padding_for(p.name, backend, sm, kv_cache_dtype)
    budget = min(max_num_batched_tokens, p.rule.prefill_graph_max_tokens or max_num_batched_tokens)
    n_req = max(1, min(d.num_prompts, budget // prompt_len)) if prompt_len <= budget else 1
    choice = route_for(p.rule, model, model.topk, "prefill", [prompt_len] * n_req, [min(prompt_len, budget)] * n_req,
                       num_heads)
    prefill = choice.route if choice.route == "mha-dense" else ("sparse-mqa" if pad else "fa3-sparse")
    decode, thr, uniform = _decode(p, backend, sm, kv_cache_dtype, num_heads)
    where = "an H200" if sm == "sm90" else f"an H200; read for sm90, applied to {sm}"
    note = (f"SGLang's step holds at most its chunked_prefill_size ({budget} on {where}); the lab's serving model "
            f"steps at max_num_batched_tokens {max_num_batched_tokens}: give --max-num-batched-tokens {budget} to "
            "price SGLang's own steps" if budget < max_num_batched_tokens else "")
    return {**out, "backend": backend, "padding": pad, "prefill_route": prefill, "note": note,
            "prefill_reason": choice.reason, "decode_route": decode, "decode_threshold": thr,
            "uniform_decodes": uniform, "padded_path": _padded_path(backend, pad, num_heads, prefill, decode)}


def engine_table(deployment) -> list[dict]:
    """:func:`engine_summary` of every engine version for one deployment (``mla-lab engines``: PR #53878's)."""
    return [engine_summary(n, deployment) for n in ENGINE_PRESETS]
