"""Strategies as the engines run them: where the padded Q lives (placement) x what its padded heads hold (content).

FlashMLA's sparse prefill kernel takes 64 or 128 query heads (``csrc/api/sparse_fwd.h``); a TP rank holds fewer, so
the Q of ``H`` real heads is padded to ``H'`` (:func:`mla_lab.buffers.padded_num_heads`). A strategy is:

==================  =============================================================================================
placement           where the padded ``[T, H', 576]`` Q lives
==================  =============================================================================================
``per_call_empty``  a fresh ``q.new_empty((T, H', 576))`` per layer call, real heads copied in (vLLM before PR
                    #53878, ``_bf16_flash_mla_kernel``, stored pre-PR commit 60191e18); padded heads hold whatever the
                    caching allocator's block held: zeros if only the pad ever used it, stale data otherwise
``per_call_zeros``  ``q.new_zeros(...)`` + copy per call (SGLang ``_forward_flashmla_sparse``); zeros, paid per call
``private_workspace``  a ``(max_num_batched_tokens, H', 576)`` workspace of its own, ``concat_mla_q`` writing the real
                    heads into it (vLLM at PR #53878: constructor-time view, never written: zeros)
``shared_workspace``   the same shape as a view into the workspace shared with the fused-MoE and indexer scratch
                    (vLLM after PR #56902): the padded heads hold that scratch (stale) unless the concat zeroes them
``subchunk``        a zeroed ``(S, H', 576)`` workspace; the step's tokens go through the kernel ``S`` at a time (no
                    engine does this; the lab's proposal, issue 12)
``kernel_native``   "real-head FlashMLA (modelled)": a FlashMLA-style kernel that takes the real head count: the
                    concat into an ``H``-head buffer, no padded buffer, no pad copy, no padded output (its MMAs still
                    fill 64-row wgmma tiles on sm90); modelled, and no lower limit of the others: vLLM 0.33.0's
                    FlashMLA run with ``h_q = 8`` measured slower than padded to 64 (:data:`mla_lab.labels.KERNEL_NATIVE_MEASURED`)
``fa3_sparse``      no padded Q at all: vLLM ``FLASH_ATTN_MLA_SPARSE`` (PR #46189, merged 2026-06-19,
                    ``vllm/v1/attention/backends/mla/flashattn_mla_sparse.py``; vLLM's Hopper default for head size
                    576): FA3 varlen with ``q = q_rope``, ``q_v = q_nope``, the top-k indices as a page-size-1 block
                    table, the real heads; no concat, no padded tensor, no padded output
``packed``          the lab's packed kernel (:mod:`mla_lab.kernels.packed`: ``g = 64 / H`` tokens x ``H`` heads per
                    64-row tile over the union of the group's top-k sets): Q at the real heads, the union builder's
                    buffers, no padded workspace; every prefill on it (no dense-MHA route of its own), decode tokens
                    on vLLM 0.33.0's FA3 sparse (per token); measured kernel, modelled step
                    (:mod:`mla_lab.model.packed_kernel`); ``packed:<overlap>`` names another assumed pairwise overlap
                    of neighbouring tokens' top-k sets past the top-k (``packed`` = the default there)
==================  =============================================================================================

**Routes.** A strategy also carries the engine's route rule (:mod:`mla_lab.routes`): which attention route
(``sparse-mqa``, ``fa3-sparse``, ``mha-dense``, ``mha-masked``) a step takes by model, prompt length and phase.
Each placement has a default rule (:data:`DEFAULT_RULES`: vLLM's FlashMLA backend for the vLLM placements, SGLang's
forced ``flashmla_sparse`` for ``per_call_zeros``, vLLM's FA3 backend for ``fa3_sparse``, none for the lab's
``kernel_native``); ``<name>@<rule>`` names the same placement under another rule (``per_call_zeros@sglang-dense``:
SGLang's documented dense route, dense MHA for prefills of <= 2048 tokens, which SGLang 0.5.23 takes on an H200 only
with its prefill CUDA graphs off; its default is ``sglang@0.5.23``; ``@sglang-default``, the old name, is read as
``@sglang-dense``). :func:`strategy_route` gives the route of a
step, :func:`preset_table` every preset's placement, content, route per prefill length and decode path.

Content (what the padded heads hold while the kernel runs): ``zeros`` or ``stale`` (non-zero data: the kernel's
time depends on it, power-limited clocks; :mod:`mla_lab.model.content`). Zero policy of a pre-padded workspace:
``zero_once`` (zeroed at allocation), ``zero_per_call`` (the concat writes zeros into the padded heads,
``concat_mla_q(..., zero_padding=True)``), ``none`` (left as the workspace's other users leave them).

Canonical names (:func:`parse_strategy`): ``per_call_empty:zeros``, ``per_call_empty:stale``, ``per_call_zeros``,
``private_workspace``, ``shared_workspace:none``, ``shared_workspace:zero_per_call``, ``subchunk:<S>`` (each
chunk's output copied into the step's), ``subchunk:<S>:views`` (the consumer runs per chunk on views),
``subchunk:<S>:graph2`` (views hand-off over TWO zeroed S-row workspaces, chunk i on side stream i % 2, the whole
chunk loop captured in one CUDA graph per T; the lab's proposal, issue 23), ``kernel_native``. Engine presets (:data:`PRESETS`) and the first version's names (:data:`ALIASES`) expand to them.

**Engine versions** (:mod:`mla_lab.engines`): ``vllm@0.33.0``, ``sglang@0.5.23`` ... are door names too
(:data:`ENGINE_PRESET_MEMBERS`): each expands to the strategies of its sm90 bf16-KV default with the version's route
rule (``fa3_sparse@vllm-0.33.0``, ``shared_workspace:none@vllm-0.33.0-flashmla``, ``per_call_zeros@sglang-0.5.23``,
``per_call_empty:zeros@vllm-0.24.0`` ...). :data:`PRESETS` keeps the lab's first, PR-era names (the measured data
and its tests are labelled with them); ``vllm@pr53878-before`` / ``vllm@pr53878`` / ``vllm@56902`` expand to the same
members as ``vllm-pre-53878`` / ``vllm-53878`` / ``vllm-56902``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._validate import check_int
from .engines import ENGINE_PRESETS as _ENGINE_PRESETS
from .engines import decode_threshold, engine_preset, padding_for, sparse_backend
from .engines import engine_names as _engine_names
from .labels import (
    KERNEL_NATIVE_LABEL,
    KERNEL_NATIVE_NOTE,
    PACKED_NOTE,
    SGLANG_DENSE_LABEL,
    SGLANG_DENSE_NOTE,
)
from .routes import ENGINE_RULES, RULE_ALIASES, model_family, route_for

__all__ = ["MEASURED_STRATEGIES", "SERVE_PRESETS", "Strategy", "PLACEMENTS", "CONTENTS", "ZERO_POLICIES", "PRESETS", "ALIASES", "PRESET_SOURCES",
           "parse_strategy", "as_strategy", "expand", "expand_strategies", "resolve_strategy", "preset_of",
           "LEGACY_MEASURED", "measured_as", "BASELINE", "PR_STRATEGY", "SUBCHUNK_ROWS", "canonical_names",
           "fixed_strategies", "SEED_STRATEGIES", "SWEEP_STRATEGIES", "EXPLORER_STRATEGIES", "real_strategies",
           "advise_candidates", "SEED_COMPARISONS", "BENCH_PRESET_LABELS", "DEFAULT_RULES", "strategy_route",
           "preset_table", "SUBCHUNK_GRAPH", "ENGINE_PRESET_MEMBERS", "engine_strategies",
           "ENGINE_LEGACY_NAMES", "resolve_engine", "engine_summary", "engine_table", "blackwell_rows",
           "PR_TRADE_BY_ENGINE", "FORCED_TODAY", "PRESET_LABELS", "STRATEGY_NOTES", "preset_label", "strategy_notes",
           "FA3_DECODE_PLACEMENTS"]

PLACEMENTS = ("per_call_empty", "per_call_zeros", "private_workspace", "shared_workspace", "subchunk",
              "kernel_native", "fa3_sparse", "packed")
#: The engine route rule (:data:`mla_lab.routes.ENGINE_RULES`) each placement runs under unless its name says
#: ``@<rule>``: vLLM's FLASHMLA_SPARSE paths (DeepSeek-V3.2 takes dense MHA when every prefill has seq_len <= topk,
#: vLLM #47327; GLM-5/5.2 is MQA-only, #52512); SGLang with ``flashmla_sparse`` forced; vLLM's FA3 sparse backend;
#: ``kernel_native`` none (always ``sparse-mqa``: no engine's dense-MHA route for short prompts).
DEFAULT_RULES = {"per_call_empty": "vllm-flashmla", "private_workspace": "vllm-flashmla",
                 "shared_workspace": "vllm-flashmla", "subchunk": "vllm-flashmla", "per_call_zeros": "sglang-flashmla",
                 "fa3_sparse": "vllm-fa3", "kernel_native": None, "packed": "mla_lab-packed"}
#: Placements whose decode tokens run on vLLM 0.33.0's FA3 sparse (real heads, per token): FA3 sparse itself and the
#: lab's packed kernel (a decode step's tokens belong to different requests: nothing to pack).
FA3_DECODE_PLACEMENTS = ("fa3_sparse", "packed")
CONTENTS = ("zeros", "stale")
ZERO_POLICIES = ("zero_once", "zero_per_call", "none")
#: Sub-chunk sizes the sweep prices by default (rows of the padded workspace).
SUBCHUNK_ROWS = (1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Strategy:
    """One way to feed the kernel its padded heads.

    Attributes:
        placement: one of :data:`PLACEMENTS`.
        content: what the padded heads hold during the kernel (:data:`CONTENTS`).
        zero_policy: for pre-padded workspaces (:data:`ZERO_POLICIES`), else None.
        rows: workspace rows ``S`` of ``subchunk``, else None.
        handoff: ``subchunk`` only: ``copy`` (each chunk's ``out[:, :H]`` copied into the step's ``[T, H, 512]``
            output) or ``views`` (the consumer, the W_UV bmm, runs per chunk on the chunk's view: no copy, one more
            launch per chunk) or ``graph2`` (views hand-off; two S-row workspaces, chunk i on side stream i % 2 forked
            from and joined back to the caller's stream, the loop captured in one CUDA graph per ``T``: no per-chunk
            launch cost; measured on an H200, ``data/measured/h200/between_process/subgraph.csv``).
        route_rule: the engine route rule when it is not the placement's default (:data:`DEFAULT_RULES`), else
            None; :attr:`rule` is the one in force.
        overlap: ``packed`` only: the assumed pairwise overlap of neighbouring tokens' top-k sets past the top-k
            (``packed:<overlap>``); None: the default (:data:`mla_lab.model.packed_kernel.PACKED_OVERLAP_DEFAULT`).
    """

    placement: str
    content: str
    zero_policy: str | None = None
    rows: int | None = None
    handoff: str | None = None
    route_rule: str | None = None
    overlap: float | None = None

    @property
    def rule(self) -> str | None:
        """The route rule in force (:data:`mla_lab.routes.ENGINE_RULES` name; None: always ``sparse-mqa``)."""
        return self.route_rule or DEFAULT_RULES[self.placement]

    @property
    def padded(self) -> bool:
        """The placement feeds FlashMLA a head-padded Q (every placement but ``kernel_native``, ``fa3_sparse`` and
        ``packed``)."""
        return self.placement not in ("kernel_native", "fa3_sparse", "packed")

    @property
    def views_handoff(self) -> bool:
        """``subchunk`` whose chunks' outputs go to the consumer as views (``views`` and ``graph2``: no copy)."""
        return self.handoff in ("views", "graph2")

    @property
    def workspaces(self) -> int:
        """How many Q-concat workspaces the strategy holds (2 for ``subchunk:<S>:graph2``, else 1)."""
        return 2 if self.handoff == "graph2" else 1

    @property
    def graphed(self) -> bool:
        """The chunk loop runs as one captured CUDA graph (``subchunk:<S>:graph2``)."""
        return self.handoff == "graph2"

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        """The canonical name (:func:`parse_strategy` round-trips it)."""
        p = self.placement
        if p == "per_call_empty":
            base = f"per_call_empty:{self.content}"
        elif p == "shared_workspace":
            base = f"shared_workspace:{self.zero_policy}"
        elif p == "subchunk":
            base = f"subchunk:{self.rows}" + (f":{self.handoff}" if self.handoff in ("views", "graph2") else "")
        elif p == "packed" and self.overlap is not None:
            base = f"packed:{self.overlap:g}"
        else:
            base = p
        return base + (f"@{self.route_rule}" if self.route_rule else "")

    @property
    def pre_padded(self) -> bool:
        """The padded Q is a workspace the concat writes into (no per-call pad tensor, no pad copy)."""
        return self.placement in ("private_workspace", "shared_workspace", "subchunk")

    @property
    def per_call_pad(self) -> bool:
        """A pad tensor is allocated and the real heads copied in on every layer call."""
        return self.placement in ("per_call_empty", "per_call_zeros")

    @property
    def concat_zeroes_padding(self) -> bool:
        """The concat writes zeros into the padded heads on every call (``zero_padding=True``)."""
        return self.zero_policy == "zero_per_call"


def _fixed(placement, content, zero_policy=None, rows=None) -> Strategy:
    return Strategy(placement, content, zero_policy, rows)


_FIXED = {
    "per_call_empty:zeros": _fixed("per_call_empty", "zeros"),
    "per_call_empty:stale": _fixed("per_call_empty", "stale"),
    "per_call_zeros": _fixed("per_call_zeros", "zeros"),
    "private_workspace": _fixed("private_workspace", "zeros", "zero_once"),
    "shared_workspace:none": _fixed("shared_workspace", "stale", "none"),
    "shared_workspace:zero_per_call": _fixed("shared_workspace", "zeros", "zero_per_call"),
    "kernel_native": _fixed("kernel_native", "zeros"),
    "fa3_sparse": _fixed("fa3_sparse", "zeros"),
    "packed": _fixed("packed", "zeros"),
}

#: Engine presets -> canonical strategies (two names = the range the engine can be in).
PRESETS = {
    "vllm-pre-53878": ("per_call_empty:zeros", "per_call_empty:stale"),
    "vllm-53878": ("private_workspace",),
    "vllm-56902": ("shared_workspace:none",),
    "vllm-fa3-sparse": ("fa3_sparse",),
    "sglang-dense": ("per_call_zeros@sglang-dense",),
    "sglang-flashmla-sparse": ("per_call_zeros",),
    "kernel-native": ("kernel_native",),
}
#: Where each preset's behaviour is written down.
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
#: How outputs label a preset whose name alone would mislead (advise, serve, the report; :mod:`mla_lab.labels`):
#: ``sglang-dense`` is not SGLang's default today (that is ``sglang@0.5.23``), ``kernel-native`` no engine's kernel.
PRESET_LABELS = {"sglang-dense": SGLANG_DENSE_LABEL, "kernel-native": KERNEL_NATIVE_LABEL}
#: The line an output prints under a table holding these strategies (:func:`strategy_notes`).
STRATEGY_NOTES = {"kernel_native": KERNEL_NATIVE_NOTE, "per_call_zeros@sglang-dense": SGLANG_DENSE_NOTE,
                  "packed": PACKED_NOTE}


def preset_label(preset: str) -> str:
    """The label outputs print for a preset name (:data:`PRESET_LABELS`; others as they are, "" stays "")."""
    return PRESET_LABELS.get(preset, preset)


def strategy_notes(strategies) -> list[str]:
    """The notes an output prints under a table holding ``strategies`` (canonical names): :data:`STRATEGY_NOTES`
    of those present, once each, in that order; [] when none is."""
    names = {str(s) for s in strategies}
    names |= {n.partition(":")[0] for n in names if n.startswith("packed:")}  # packed:<overlap> has packed's note
    return [note for s, note in STRATEGY_NOTES.items() if s in names]


#: Engine-version presets (:data:`mla_lab.engines.ENGINE_PRESETS`) -> the lab's canonical strategies for their sm90
#: bf16-KV default (``<placement>@<route rule>``; two = the range: padded heads zeros / stale). vLLM 0.13.0 builds Q
#: with ``torch.cat`` (a fresh tensor, no buffer) before the same ``new_empty`` pad: priced as ``per_call_empty``.
ENGINE_PRESET_MEMBERS = {
    "vllm@pr53878-before": ("per_call_empty:zeros", "per_call_empty:stale"),
    "vllm@pr53878": ("private_workspace",),
    "vllm@56902": ("shared_workspace:none",),
    "vllm@0.13.0": ("per_call_empty:zeros@vllm-0.13.0", "per_call_empty:stale@vllm-0.13.0"),
    "vllm@0.24.0": ("per_call_empty:zeros@vllm-0.24.0", "per_call_empty:stale@vllm-0.24.0"),
    "vllm@0.33.0": ("fa3_sparse@vllm-0.33.0",),
    "vllm@0.33.0-flashmla": ("shared_workspace:none@vllm-0.33.0-flashmla",),
    "sglang@0.5.23": ("per_call_zeros@sglang-0.5.23",),
}
if set(ENGINE_PRESET_MEMBERS) != set(_ENGINE_PRESETS):
    raise ImportError(f"ENGINE_PRESET_MEMBERS {sorted(ENGINE_PRESET_MEMBERS)} != engine presets "
                      f"{sorted(_ENGINE_PRESETS)}")


#: The lab's first preset names -> engine presets, read at the engines door (:func:`resolve_engine`). As strategy
#: presets (:data:`PRESETS`) they keep their measured meaning; as an ``--engine`` they name the engine they were
#: about: ``vllm-fa3-sparse`` -> vLLM 0.33.0 (FA3 sparse is its sm90 default), ``sglang`` -> SGLang 0.5.23.
ENGINE_LEGACY_NAMES = {"vllm-pre-53878": "vllm@pr53878-before", "vllm-53878": "vllm@pr53878",
                       "vllm-56902": "vllm@56902", "vllm-fa3-sparse": "vllm@0.33.0", "sglang": "sglang@0.5.23",
                       "sglang-flashmla-sparse": "sglang@0.5.23"}


def resolve_engine(name: str) -> str:
    """An engine preset name (:data:`mla_lab.engines.ENGINE_PRESETS`) for an engine preset or one of the first
    names (:data:`ENGINE_LEGACY_NAMES`).

    Raises:
        ValueError: one line naming ``--engine``, the value and the allowed values.
    """
    if isinstance(name, str):
        if name in _ENGINE_PRESETS:
            return name
        if name in ENGINE_LEGACY_NAMES:
            return ENGINE_LEGACY_NAMES[name]
    raise ValueError(f"--engine={name!r} is not valid; allowed: {_engine_names()} (or the first names "
                     f"{list(ENGINE_LEGACY_NAMES)})")


def engine_strategies(engine: str) -> list[str]:
    """The canonical strategies of an engine preset (``vllm@0.33.0``) or one of its first names (``vllm-53878``,
    :data:`mla_lab.engines.LEGACY_NAMES`).

    Raises:
        ValueError: one line naming ``--engine``, the value and the allowed values.
    """
    return [parse_strategy(n).name for n in ENGINE_PRESET_MEMBERS[resolve_engine(engine)]]


#: The first version's names, kept so existing parameter files and data keep working (``sglang`` named SGLang's
#: documented dense route, now preset ``sglang-dense``: SGLang 0.5.23's H200 default is ``sglang@0.5.23``).
ALIASES = {"unfused": "vllm-pre-53878", "fused": "vllm-53878", "sglang": "sglang-dense"}
#: What the first version's *measurements* labelled ``unfused`` / ``fused`` ran: a ``new_zeros`` pad per call and a
#: zero-initialised private workspace (measured rows and the layer runner keep those labels).
LEGACY_MEASURED = {"unfused": "per_call_zeros", "fused": "private_workspace"}


def measured_as(name: str) -> str:
    """The canonical strategy a measured row's label stands for (the first version's labels mapped by
    :data:`LEGACY_MEASURED`, others as :func:`resolve_strategy`)."""
    return LEGACY_MEASURED.get(name) or resolve_strategy(name)


#: The row every TTFT change is taken against: vLLM before the PR with zero padded heads (the favourable end of
#: its range; the stale end is a row of its own).
BASELINE = "per_call_empty:zeros"


def parse_strategy(name: str) -> Strategy:
    """A canonical strategy name -> :class:`Strategy` (a :class:`Strategy` is returned as it is).

    Presets (``vllm-53878``) and the first version's aliases (``unfused`` / ``fused``) are *not* canonical names:
    they are read at the door (parameters, CLI, legacy rows) by :func:`expand` / :func:`resolve_strategy` /
    :func:`measured_as`, and everything below takes the :class:`Strategy` those give.

    Raises:
        ValueError: an unknown name (a preset or alias says where it is accepted), or ``subchunk:<S>`` with S not a
            positive int (names what is allowed).
    """
    if isinstance(name, Strategy):
        return name
    if not isinstance(name, str):
        raise ValueError(f"strategy={name!r} must be a str or a Strategy; allowed: {canonical_names()}")
    if "@" in name:
        base, _, rule = name.partition("@")
        rule = RULE_ALIASES.get(rule, rule)  # an old rule name (sglang-default) read as its new one
        st = parse_strategy(base)
        if rule not in ENGINE_RULES:
            raise ValueError(f"strategy={name!r}: route rule {rule!r} is not known; allowed: {list(ENGINE_RULES)}")
        return st if rule == DEFAULT_RULES[st.placement] else replace(st, route_rule=rule)
    if name in _FIXED:
        return _FIXED[name]
    if name.startswith("subchunk:"):
        parts = name.split(":")
        raw = parts[1]
        try:
            rows = int(raw)
        except ValueError:
            raise ValueError(f"strategy={name!r}: subchunk rows {raw!r} must be a positive int "
                             "(e.g. subchunk:4096 or subchunk:4096:views)") from None
        check_int("subchunk rows", rows)
        if len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("copy", "views", "graph2")):
            raise ValueError(f"strategy={name!r}: the subchunk hand-off must be 'copy' (default), 'views' or "
                             "'graph2' (e.g. subchunk:4096:views, subchunk:2048:graph2)")
        handoff = parts[2] if len(parts) == 3 else "copy"
        return Strategy("subchunk", "zeros", "zero_once", rows, handoff)
    if name.startswith("packed:"):
        return _packed(name)
    if name in PRESETS or name in ALIASES or name == "kernel-native" or name in ENGINE_PRESET_MEMBERS:
        raise ValueError(f"strategy={name!r} is a preset or alias, read only at the door (parameters, CLI, legacy "
                         f"rows: mla_lab.placement.expand / resolve_strategy); allowed here: {canonical_names()}")
    raise ValueError(f"strategy={name!r} is not known; allowed: {canonical_names()}, presets {list(PRESETS)}, "
                     f"engine presets {list(ENGINE_PRESET_MEMBERS)} or aliases {list(ALIASES)}")


#: Below the door a strategy is a :class:`Strategy`; this is :func:`parse_strategy` under the name the cost model's
#: functions use for "a Strategy, or a canonical name of one".
as_strategy = parse_strategy


def canonical_names() -> list[str]:
    """Every fixed canonical name plus the ``subchunk:<S>`` pattern."""
    return list(_FIXED) + ["subchunk:<S>", "subchunk:<S>:views", "subchunk:<S>:graph2", "packed:<overlap>",
                           "<name>@<rule>"]


def _packed(name: str) -> Strategy:
    """``packed:<overlap>``; raises ValueError (one line) unless the overlap is a number in [0, 1]."""
    raw = name.partition(":")[2]
    try:
        o = float(raw)
    except ValueError:
        o = float("nan")
    if not 0.0 <= o <= 1.0:
        raise ValueError(f"strategy={name!r}: the packed overlap {raw!r} must be a number in [0, 1] "
                         "(e.g. packed:0.44; plain 'packed' takes the default)")
    return Strategy("packed", "zeros", overlap=o)


def _door_name(n) -> list[str]:
    if isinstance(n, Strategy):
        return [n.name]
    n = ALIASES.get(n, n)
    if n == "kernel_native":
        n = "kernel-native"
    if n in PRESETS:
        return list(PRESETS[n])
    if n in ENGINE_PRESET_MEMBERS:
        return [parse_strategy(m).name for m in ENGINE_PRESET_MEMBERS[n]]
    return [parse_strategy(n).name]


def expand(names) -> list[Strategy]:
    """The door: presets, aliases (``unfused`` / ``fused``), canonical names or :class:`Strategy` objects ->
    :class:`Strategy` objects (presets expanded to their members, order kept, duplicates dropped). A single str is
    one name.

    Raises:
        ValueError: as :func:`parse_strategy` (names the bad entry and what is allowed).
    """
    if isinstance(names, (str, Strategy)):
        names = [names]
    out: list[str] = []
    for n in names:
        out += _door_name(n)
    return [parse_strategy(n) for n in dict.fromkeys(out)]


def expand_strategies(names) -> list[str]:
    """:func:`expand` as canonical names (the form rows, CSV columns and dict keys carry).

    Raises:
        ValueError: as :func:`parse_strategy`.
    """
    return [s.name for s in expand(names)]


def resolve_strategy(name) -> str:
    """One canonical name for a canonical name, an alias, a preset or a :class:`Strategy` (a two-member preset gives
    its first member, the zeros end of its range: ``unfused`` / ``vllm-pre-53878`` -> ``per_call_empty:zeros``).

    Raises:
        ValueError: as :func:`parse_strategy`.
    """
    return _door_name(name)[0]


def preset_of(name: str) -> str:
    """The engine preset a canonical strategy belongs to ("" for the lab's own, e.g. ``subchunk:4096``)."""
    for preset, members in PRESETS.items():
        if name in members:
            return preset
    for preset, members in ENGINE_PRESET_MEMBERS.items():
        if name in members:
            return preset
    return ""


#: vLLM PR #53878's strategy: the pre-padded private workspace.
PR_STRATEGY = "private_workspace"


def fixed_strategies() -> list[str]:
    """Every fixed canonical name (``subchunk:<S>`` takes any positive S and is not listed)."""
    return list(_FIXED)


#: The sub-chunk strategy measured fastest (H200, 5 fresh processes, ``subgraph.csv``): 2 x 2048-row workspaces,
#: two streams, the chunk loop in one CUDA graph (issue 23).
SUBCHUNK_GRAPH = "subchunk:2048:graph2"

#: What the seed's model comparison prices (:func:`mla_lab.model.ttft.compare_strategies` default): every engine
#: preset's members, the shared workspace zeroed per call, the sub-chunk sizes of :data:`SUBCHUNK_ROWS` and
#: :data:`SUBCHUNK_GRAPH`.
SEED_STRATEGIES = tuple(expand_strategies(list(PRESETS) + ["shared_workspace:zero_per_call"]
                                          + [f"subchunk:{s}" for s in SUBCHUNK_ROWS] + [SUBCHUNK_GRAPH]))

#: The sweep's default ``strategies`` parameter: every engine preset, the shared workspace with the concat zeroing
#: its padded heads, the sub-chunked workspace at :data:`SUBCHUNK_ROWS` with the three hand-offs, and the lab's
#: packed kernel (door names; the report's frontier draws ``packed`` beside the engines' strategies).
SWEEP_STRATEGIES = (*PRESETS, "shared_workspace:zero_per_call", *(f"subchunk:{s}" for s in SUBCHUNK_ROWS),
                    *(f"subchunk:{s}:views" for s in SUBCHUNK_ROWS), *(f"subchunk:{s}:graph2" for s in SUBCHUNK_ROWS),
                    "packed")

#: The strategies the explorer prices: every fixed canonical strategy and the sub-chunked workspace at 4096 rows.
EXPLORER_STRATEGIES = (*_FIXED, "subchunk:4096", "subchunk:4096:views")
#: Measured by default on a GPU (:mod:`mla_lab.measure.attention`): both ends of vLLM before PR #53878, the PR, after
#: PR #56902 (and with the concat zeroing the padded heads), SGLang's padded route and a sub-chunked workspace.
MEASURED_STRATEGIES = ("per_call_empty:zeros", "per_call_empty:stale", "private_workspace", "shared_workspace:none",
                       "shared_workspace:zero_per_call", "per_call_zeros", "subchunk:4096")
#: ``mla-lab serve``'s default presets and the serving demo's: vLLM before PR #53878, at it, after PR #56902.
#: ``mla-lab measure``'s ``attention_strategies`` default ``--strategies``: the PR's path, the pre-PR per-call pad,
#: and the sub-chunked workspaces (two S-row workspaces on two streams in one CUDA graph, S = 2048 / 4096; S = 2048
#: as views): the strategies of ``data/measured/h200/between_process/strategies.csv``.
TIMED_STRATEGIES = ("per_call_empty:zeros", "private_workspace", "subchunk:2048:graph2", "subchunk:4096:graph2",
                    "subchunk:2048:views")
SERVE_PRESETS = ("vllm-pre-53878", "vllm-53878", "vllm-56902")


def real_strategies(subchunk_rows=(1, 5, 64)) -> list[str]:
    """Canonical names of every strategy that runs on tensors (every engine preset's members but
    ``kernel_native``, the zero policies, and ``subchunk:<S>`` for ``subchunk_rows``, the last also with views, the
    middle one with ``graph2``: several chunks over the two workspaces)."""
    names = [n for members in PRESETS.values() for n in members
             if parse_strategy(n).padded and parse_strategy(n).route_rule is None]
    names += ["shared_workspace:zero_per_call"] + [f"subchunk:{s}" for s in subchunk_rows]
    names += [f"subchunk:{subchunk_rows[-1]}:views", f"subchunk:{subchunk_rows[len(subchunk_rows) // 2]}:graph2"]
    return list(dict.fromkeys(names))


def advise_candidates(max_num_batched_tokens: int) -> list[str]:
    """Every strategy ``mla-lab advise`` weighs: the presets' members, ``shared_workspace:zero_per_call`` and
    ``subchunk:S`` / ``subchunk:S:views`` / ``subchunk:S:graph2`` for S = 512, 1024, ... below
    ``max_num_batched_tokens``."""
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
#: (:func:`mla_lab.report.seed_answer.pr_trade_by_engine`): as it was (the PR's build), as it is in vLLM 0.33.0 with
#: FLASHMLA_SPARSE forced (the PR's workspace, by then the per-call shared view, against the pre-PR per-call pad, both
#: under 0.33.0's routes: 1024-token prefills dense MHA, the padded kernel on decode rows only), and vLLM 0.33.0's
#: default FA3 sparse against that forced path.
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


def strategy_route(strategy, model_name: str, topk: int, seq_lens=None, query_lens=None,
                   phase: str = "prefill", num_heads: int | None = None) -> str:
    """The attention route (:data:`mla_lab.routes.ROUTES`) ``strategy`` takes for a batch of ``model_name``:
    :func:`mla_lab.routes.route_for` under the strategy's rule (:attr:`Strategy.rule`); ``sparse-mqa`` for a
    strategy with no rule (``kernel_native``). ``seq_lens`` / ``query_lens`` per request (prefill only);
    ``num_heads`` per rank picks the engine-version rules' decode threshold (None: their default, the 8-head value).

    Raises:
        ValueError: as :func:`parse_strategy` and :func:`mla_lab.routes.route_for`.
    """
    st = parse_strategy(strategy)
    if st.rule is None:
        return "sparse-mqa"
    return route_for(st.rule, model_name, topk, phase, seq_lens, query_lens, num_heads).route


def preset_table(model_name="glm", topk: int = 2048, prompt_lens=(512, 1024, 2048, 4096, 8192)) -> list:
    """One row per preset member: ``preset``, ``strategy``, ``placement``, ``content``, ``rule``, the prefill route
    of a batch of fresh prompts per length (``route_<L>``), ``decode_route`` and ``source``. ``model_name``: a
    :class:`~mla_lab.models.ModelConfig` or a family name (:data:`mla_lab.routes.FAMILIES`; default ``glm``).

    Raises:
        ValueError: as :func:`strategy_route`.
    """
    rows = []
    for preset, members in PRESETS.items():
        for name in members:
            st = parse_strategy(name)
            row = {"preset": preset, "strategy": st.name, "placement": st.placement, "content": st.content,
                   "rule": st.rule or ""}
            for L in prompt_lens:
                row[f"route_{L}"] = strategy_route(st, model_name, topk, L, L)
            row["decode_route"] = strategy_route(st, model_name, topk, phase="decode")
            row["source"] = PRESET_SOURCES[preset]
            rows.append(row)
    return rows


def _backend_label(backend: str) -> str:
    return {"FLASH_ATTN_MLA_SPARSE": "FA3 sparse", "FLASH_ATTN_MLA_SPARSE_FA4": "FA4 sparse",
            "FLASHINFER_MLA_SPARSE": "FlashInfer sparse", "FLASHMLA_SPARSE": "FlashMLA sparse",
            "FLASHINFER_MLA_SPARSE_SM90": "FlashInfer sparse (sm90)"}.get(backend, backend)


def engine_summary(engine: str, model, topk: int, num_heads: int, sm: str = "sm90",
                   kv_cache_dtype: str = "bf16", prompt_len: int = 1024, max_num_batched_tokens: int = 16384,
                   num_prompts: int = 32) -> dict:
    """What one engine version does for one deployment, from its facts (:mod:`mla_lab.engines`) and route rule
    (:mod:`mla_lab.routes`): a code reading, not a measurement.

    Args:
        engine: an engine preset (``vllm@0.33.0``) or a first name (``vllm-53878``).
        model, topk: the model (a :class:`mla_lab.models.ModelConfig`, whose family is read from its config.json,
            or a family name ``glm`` / ``deepseek`` / ``other``) and its ``index_topk``.
        num_heads: attention heads per rank (``num_attention_heads // tp``).
        sm: ``sm90`` / ``sm100``; kv_cache_dtype: ``bf16`` / ``fp8...``.
        prompt_len, max_num_batched_tokens, num_prompts: the workload: the first step holds
            ``min(num_prompts x prompt_len, max_num_batched_tokens)`` tokens of fresh prompts (seq_len = prompt_len);
            for SGLang the budget is its H200 ``chunked_prefill_size`` (8192, also the prefill graphs' cap).

    Returns:
        ``{preset, engine, version, release_date, backend, padding (heads the padded kernel pads to; 0: real
        heads), prefill_route, prefill_reason, decode_route, decode_threshold, uniform_decodes, padded_path (where
        the padded FlashMLA kernel runs), models (families the version runs), supported, sources, scope}``.

    Raises:
        ValueError: a bad engine name (one line, the allowed values); bad ints.
    """
    p = engine_preset(resolve_engine(engine))
    check_int("num_heads", num_heads)
    check_int("prompt_len", prompt_len)
    fam = model_family(model)
    out = {"preset": p.name, "engine": p.engine_version.engine, "version": p.engine_version.version,
           "release_date": p.engine_version.release_date, "models": list(p.engine_version.models),
           "supported": fam in p.engine_version.models, "sources": p.sources,
           "scope": "modelled from the engine's source (a code reading, not run)"}
    try:
        backend = sparse_backend(p.name, sm, kv_cache_dtype, num_heads)
    except ValueError as e:
        return {**out, "backend": None, "padding": None, "prefill_route": None, "prefill_reason": str(e),
                "decode_route": None, "decode_threshold": None, "uniform_decodes": None, "padded_path": "-"}
    pad = padding_for(p.name, backend, sm, kv_cache_dtype)
    rule = ENGINE_RULES[p.route_rule]
    # SGLang's step budget on an H200 is its chunked_prefill_size (8192, the prefill graphs' cap), not vLLM's
    budget = min(max_num_batched_tokens, rule.prefill_graph_max_tokens or max_num_batched_tokens)
    n_req = max(1, min(num_prompts, budget // prompt_len)) if prompt_len <= budget else 1
    q = min(prompt_len, budget)
    choice = route_for(rule, model, topk, "prefill", [prompt_len] * n_req, [q] * n_req, num_heads)
    dec_backend = "FLASH_ATTN_MLA_SPARSE" if rule.decode_route == "fa3-sparse" and p.engine_version.engine == \
        "sglang" else backend
    try:
        thr, uniform = decode_threshold(p.name, dec_backend, sm, num_heads)
    except ValueError:
        thr, uniform = rule.decode_threshold(num_heads), rule.uniform_decodes
    prefill_route = choice.route
    if p.engine_version.engine == "vllm" and prefill_route in ("sparse-mqa", "fa3-sparse"):
        prefill_route = "sparse-mqa" if pad else "fa3-sparse"
    decode_route = rule.decode_route if p.engine_version.engine == "sglang" else ("sparse-mqa" if pad
                                                                                  else "fa3-sparse")
    where = []
    if pad and prefill_route == "sparse-mqa":
        where.append("prefill rows")
    if pad and decode_route == "sparse-mqa":
        where.append("decode rows")
    padded_path = (" and ".join(where) + f" ({_backend_label(backend)}, heads padded {num_heads} -> "
                   f"{-(-num_heads // pad) * pad})") if where else (
        f"nowhere: {_backend_label(backend)} takes the real {num_heads} heads" if not pad else
        "nowhere at this prompt length (prefill rows dense MHA, decode rows another backend)")
    if where == ["decode rows"] and prefill_route == "mha-dense":
        padded_path += "; prefill rows dense MHA"
    where = "an H200" if sm == "sm90" else f"an H200; read for sm90, applied to {sm}"
    note = (f"SGLang's step holds at most its chunked_prefill_size ({budget} on {where}); the lab's serving model "
            f"steps at max_num_batched_tokens {max_num_batched_tokens}: give --max-num-batched-tokens {budget} to "
            "price SGLang's own steps" if budget < max_num_batched_tokens else "")
    return {**out, "backend": backend, "padding": pad, "prefill_route": prefill_route, "note": note,
            "prefill_reason": choice.reason, "decode_route": decode_route, "decode_threshold": thr,
            "uniform_decodes": uniform, "padded_path": padded_path}


def engine_table(model="glm", topk: int = 2048, num_heads: int = 8, sm: str = "sm90",
                 kv_cache_dtype: str = "bf16", prompt_len: int = 1024, max_num_batched_tokens: int = 16384,
                 num_prompts: int = 32) -> list[dict]:
    """:func:`engine_summary` for every engine preset (default: GLM-5 TP8 = 8 heads per rank, H200, bf16 KV,
    1024-token prompts, 16384 tokens per step, 32 prompts: PR #53878's benchmark)."""
    return [engine_summary(n, model, topk, num_heads, sm, kv_cache_dtype, prompt_len, max_num_batched_tokens,
                           num_prompts) for n in ENGINE_PRESET_MEMBERS]


def blackwell_rows(num_heads: int = 8, max_num_batched_tokens: int = 16384, head_size: int = 576) -> list[dict]:
    """``b200`` (sm100) rows per engine version, bf16 and fp8 KV: the backend chosen, the heads the padded kernel
    pads to and the padded Q-concat buffer's bytes ``T x H' x head_size x 2`` (``H'`` = real heads when unpadded).
    Modelled from the engines' sources (PR-era rule 128, vLLM 0.33.0 ``prefill_padding`` 64; FA4 / FlashInfer
    defaults without padding); nothing here ran on a B200.

    Raises:
        ValueError: bad ints.
    """
    check_int("num_heads", num_heads)
    rows = []
    for name in ENGINE_PRESET_MEMBERS:
        for kv in ("bf16", "fp8"):
            try:
                b = sparse_backend(name, "sm100", kv, num_heads)
            except ValueError as e:
                rows.append({"preset": name, "arch": "b200", "kv_cache_dtype": kv, "backend": None,
                             "padding": None, "padded_heads": None, "q_buffer_mib": None, "note": str(e),
                             "scope": "modelled (engine source, not run on a B200)"})
                continue
            pad = padding_for(name, b, "sm100", kv)
            hp = -(-num_heads // pad) * pad if pad else num_heads
            rows.append({"preset": name, "arch": "b200", "kv_cache_dtype": kv, "backend": b, "padding": pad,
                         "padded_heads": hp, "q_buffer_mib": max_num_batched_tokens * hp * head_size * 2 / 2**20,
                         "note": "", "scope": "modelled (engine source, not run on a B200)"})
    return rows
