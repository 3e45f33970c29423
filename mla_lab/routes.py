"""Which attention route an engine takes, per model family, prompt length and phase (a foundation module: pure rules).

Routes (:data:`ROUTES`; ``docs/routes.md`` has the table and every source). Rules (:func:`rules`): the generic ones
below and every engine version's (:mod:`mla_lab.engines`). The family comes from config.json, never a name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validate import check_int
from .engines import ENGINE_PRESETS, EngineRule
from .engines.presets._pr_era import GLM_MQA_ONLY, VLLM_SRC

__all__ = ["ROUTES", "PHASES", "EngineRule", "RouteChoice", "rules", "engine_rule", "check_route", "route_for",
           "route_table", "model_family", "config_family", "FAMILIES", "is_equivalent", "RULE_ALIASES"]

ROUTES = ("sparse-mqa", "fa3-sparse", "mha-dense", "mha-masked")
PHASES = ("prefill", "decode")
_NOT_EQUIVALENT = ("dense causal MHA attends every earlier key; sparse attention attends the top-k only, so they "
                   "agree only when seq_len <= topk (DeepSeek-V3.2 paper, masked MHA 'to simulate DSA'; SGLang PR "
                   "#30258: 'Above 2048: approximation')")
#: config.json ``architectures`` -> family (vLLM 0.24.0 ``vllm/model_executor/models/registry.py:99,122``).
_ARCHITECTURES = {"DeepseekV32ForCausalLM": "deepseek", "GlmMoeDsaForCausalLM": "glm"}
#: config.json ``model_type`` -> family, for a config without a known ``architectures`` entry.
_MODEL_TYPES = {"deepseek_v32": "deepseek", "glm_moe_dsa": "glm"}
#: The families the rules name (``other``: a model no rule names).
FAMILIES = ("deepseek", "glm", "other")
#: The rules no engine version owns (each cites its source).
_GENERIC = (
    EngineRule("vllm-flashmla-mqa", "vllm", "sparse-mqa", "sparse-mqa", 0, (), True,
               "vLLM FLASHMLA_SPARSE before PR #47327 (release wheels 0.13.0, 2025-12-19, and 0.24.0, 2026-06-29: "
               "vllm/v1/attention/backends/mla/flashmla_sparse.py has no dense-MHA prefill; every prefill and decode "
               "token goes through the padded sparse kernel, `q.new_empty((T, padding, 576))` per call: 0.13.0 line "
               "936, 0.24.0 line 841)", family_reasons=GLM_MQA_ONLY),
    EngineRule("vllm-fa3", "vllm", "fa3-sparse", "fa3-sparse", "topk", ("deepseek",), True,
               VLLM_SRC + "; FLASH_ATTN_MLA_SPARSE (PR #46189, flashattn_mla_sparse.py at 0299fca7: FA3 varlen, "
               "q=q_rope, q_v=q_nope, max_seqlen_q=1, block_table=top-k indices; requests of <= 1024 query tokens "
               "handled as decodes), vLLM's sm90 default for head size 576 (sparse priority list quoted in vLLM "
               "issue #56564)", 1024, family_reasons=GLM_MQA_ONLY),
    EngineRule("sglang-dense", "sglang", "sparse-mqa", "fa3-sparse", 2048, ("deepseek", "glm"), False,
               "SGLang's documented dense route, prefill CUDA graphs off (not SGLang 0.5.23's H200 default, which "
               "runs short prompts in breakable prefill graphs on the padded route: rule sglang-0.5.23); "
               "sgl-project/sglang docs/basic_usage/deepseek_v32.md (PR #12868: dense MHA below 2048 tokens, "
               "FlashAttention varlen on H200, MHA_ONE_SHOT), PR #11892 (_forward_standard_mha), dsa_backend.py "
               "(_forward_flashmla_sparse: new_zeros + copy per call; decode backend fa3)"),
    EngineRule("sglang-flashmla", "sglang", "sparse-mqa", "sparse-mqa", 0, (), False,
               "SGLang with the padded route forced for every prefill and decode (nsa prefill/decode backend "
               "flashmla_sparse; _forward_flashmla_sparse new_zeros + copy per call)"),
    EngineRule("mla_lab-packed", "mla_lab", "sparse-mqa", "fa3-sparse", 0, (), True,
               "the lab's packed kernel (mla_lab/kernels/packed.py, not in any engine): prefill packed, decode vLLM "
               "0.33.0 FLASH_ATTN_MLA_SPARSE per token",
               mqa_only_reason="the packed kernel has no dense-MHA route of its own"),
)
#: Old rule names read at the door: ``sglang-default`` was SGLang's documented dense route's first name.
RULE_ALIASES = {"sglang-default": "sglang-dense"}


def rules() -> dict[str, EngineRule]:
    """Every rule by name: each engine version's (its record's ``rule``), then the generic ones."""
    out = {p.rule.name: p.rule for p in ENGINE_PRESETS.values()}
    return out | {r.name: r for r in _GENERIC}


def engine_rule(name: str) -> EngineRule:
    """The :class:`EngineRule` named ``name`` (an old name of :data:`RULE_ALIASES` read as its new one; an engine
    preset name gives its rule). Raises ValueError naming the allowed rules."""
    if name in ENGINE_PRESETS:
        return ENGINE_PRESETS[name].rule
    table = rules()
    name = RULE_ALIASES.get(name, name)
    if name not in table:
        raise ValueError(f"engine rule={name!r} is not valid; allowed: {list(table)}")
    return table[name]


def config_family(architectures=(), model_type: str = "") -> tuple[str, str]:
    """``(family, note)`` from config.json ``architectures`` or ``model_type``; ``note``: "" or the assumption
    family ``other`` is priced under."""
    for a in architectures or ():
        if a in _ARCHITECTURES:
            return _ARCHITECTURES[a], ""
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type], ""
    return "other", (f"assumption: architectures={list(architectures or [])} (model_type={model_type!r}) is none "
                     f"of {sorted(_ARCHITECTURES)}, so no engine rule names this model: priced as family "
                     "'other' (every engine takes its sparse backend route, no dense MHA prefill)")


def model_family(model) -> str:
    """The ``family`` of a ModelConfig, or a name of :data:`FAMILIES`. Raises ValueError: anything else."""
    fam = getattr(model, "family", None)
    if fam is None and isinstance(model, str) and model in FAMILIES:
        fam = model
    if fam not in FAMILIES:
        raise ValueError(f"model={model!r} does not give a family; allowed: a ModelConfig "
                         f"(mla_lab.models.load_model: the family is read from its config.json architectures) or one "
                         f"of {list(FAMILIES)} (a model or folder name does not decide the family)")
    return fam


def is_equivalent(route: str, seq_len: int, topk: int) -> bool:
    """Whether ``route`` equals the sparse attention at ``seq_len`` keys (``mha-dense``: only ``seq_len <= topk``).
    Raises ValueError: unknown route; bad ints."""
    if route not in ROUTES:
        raise ValueError(f"route={route!r} is not valid; allowed: {list(ROUTES)}")
    check_int("seq_len", seq_len)
    check_int("topk", topk)
    return route != "mha-dense" or seq_len <= topk


def check_route(route: str, model_name: str, seq_len: int, topk: int) -> str:
    """``route`` if it is equivalent for ``model_name`` at ``seq_len``. Raises ValueError: unknown route;
    ``mha-dense`` above ``topk`` (names the model, the length and the source); bad ints."""
    if not is_equivalent(route, seq_len, topk):
        raise ValueError(f"route='mha-dense' is refused for model={getattr(model_name, 'name', model_name)!r} at "
                         f"seq_len={seq_len}: not equivalent above topk={topk} ({_NOT_EQUIVALENT}); allowed: "
                         f"seq_len <= {topk}, or routes {[r for r in ROUTES if r != 'mha-dense']}")
    return route


@dataclass(frozen=True)
class RouteChoice:
    """The route one engine takes for one batch: ``route``, ``reason`` (the rule that fired), ``source``."""

    route: str
    reason: str
    source: str


def _as_list(v) -> list:
    return [v] if isinstance(v, int) and not isinstance(v, bool) else list(v)


def _lengths(seq_lens, query_lens) -> tuple[list, list]:
    """Checked ``(seq_lens, query_lens)`` lists (an int is a batch of one)."""
    if seq_lens is None:
        raise ValueError("seq_lens=None: a prefill route needs each prefill's seq_len (an int or a list of ints)")
    lens = _as_list(seq_lens)
    if not lens:
        raise ValueError("seq_lens=[] is empty; allowed: at least one positive int")
    for s in lens:
        check_int("seq_len", s)
    qlens = lens if query_lens is None else _as_list(query_lens)
    if len(qlens) != len(lens):
        raise ValueError(f"query_lens has {len(qlens)} entries for {len(lens)} seq_lens; allowed: one per request")
    for q, s in zip(qlens, lens):
        check_int("query_len", q)
        if q > s:
            raise ValueError(f"query_len={q} exceeds its seq_len={s}; allowed: query_len <= seq_len")
    return lens, qlens


def _mqa_only(r: EngineRule, fam: str, model) -> RouteChoice:
    why = (r.mqa_only_reason if r.mqa_only_reason and fam != "other"
           else dict(r.family_reasons)[fam] if fam in dict(r.family_reasons)
           else "no engine rule names this model" if fam == "other" else "no dense route in this configuration")
    return RouteChoice(r.backend_route, f"{r.name}: {getattr(model, 'name', model)} prefill takes {r.backend_route} "
                       f"({why})", r.source)


def _prefill(r: EngineRule, fam: str, model, topk: int, lens: list, qlens: list, num_heads) -> RouteChoice:
    """The prefill route of a checked batch (decode-class requests split off first)."""
    dthr = r.decode_threshold(num_heads)
    short = [q for q in qlens if q <= dthr]
    uni = short[0] if (r.uniform_decodes and short) else None
    prefills = [s for q, s in zip(qlens, lens) if q > dthr or (uni is not None and q != uni)]
    if not prefills:
        return RouteChoice(r.decode_route, f"{r.name}: every request has <= {dthr} query tokens, handled as "
                           f"decodes: {r.decode_route}", r.source)
    thr = r.dense_threshold(topk)
    if thr > topk:
        raise ValueError(f"rule {r.name!r} has dense_kv_len_threshold={thr} > topk={topk}: dense MHA would not be "
                         f"equivalent ({_NOT_EQUIVALENT}); allowed: a threshold <= topk")
    if r.prefill_graph_max_tokens and sum(qlens) <= r.prefill_graph_max_tokens and fam in r.dense_models:
        return RouteChoice(r.backend_route, f"{r.name}: the step's {sum(qlens)} tokens run inside a breakable "
                           f"prefill CUDA graph (<= {r.prefill_graph_max_tokens} tokens), where the dense route is "
                           f"off (use_mha = False): {r.backend_route}", r.source)
    if fam not in r.dense_models or thr == 0:
        return _mqa_only(r, fam, model)
    longest, every = max(prefills), max(lens)
    if not r.all_prefills and longest <= thr < every:  # SGLang's per-batch max_kv_len: a decode past top-k keeps
        # the batch off dense MHA (vLLM #47327 routes prefill rows alone: its decode rows take the sparse route)
        return RouteChoice(r.backend_route, f"{r.name}: every prefill has seq_len <= {thr} but a decode of the "
                           f"same step has seq_len {every} > {thr} (dense MHA is exact only up to topk): "
                           f"{r.backend_route}", r.source)
    if longest <= thr:
        return RouteChoice("mha-dense", f"{r.name}: every prefill has seq_len <= {thr} (longest {longest})", r.source)
    scope = "every prefill" if r.all_prefills else "the batch's longest prefill"
    return RouteChoice(r.backend_route, f"{r.name}: {scope} not under seq_len {thr} (longest {longest}): "
                       f"{r.backend_route}", r.source)


def route_for(rule: str | EngineRule, model_name, topk: int, phase: str = "prefill",
              seq_lens=None, query_lens=None, num_heads: int | None = None) -> RouteChoice:
    """The :class:`RouteChoice` of ``rule`` (a name, engine preset or :class:`EngineRule`) for a batch of
    ``model_name``: ``seq_lens`` (prefill only) and ``query_lens`` (default ``seq_lens``; those at or below the
    decode threshold at ``num_heads`` are decodes).

    Raises:
        ValueError: unknown rule / phase; prefill without ``seq_lens``; a bad length; a dense threshold > ``topk``.
    """
    r = rule if isinstance(rule, EngineRule) else engine_rule(rule)
    fam = model_family(model_name)
    check_int("topk", topk)
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not valid; allowed: {list(PHASES)}")
    if phase == "decode":
        return RouteChoice(r.decode_route, f"{r.name}: decode tokens take {r.decode_route}", r.source)
    return _prefill(r, fam, model_name, topk, *_lengths(seq_lens, query_lens), num_heads)


def route_table(rule: str | EngineRule, model_name, topk: int, prompt_lens=(512, 1024, 2048, 4096, 8192)):
    """``[{prompt_len, prefill_route, decode_route}]`` for batches of fresh prompts of one length. Raises as
    :func:`route_for`."""
    return [{"prompt_len": L, "prefill_route": route_for(rule, model_name, topk, "prefill", L, L).route,
             "decode_route": route_for(rule, model_name, topk, "decode").route} for L in prompt_lens]
