"""Which attention route an engine takes, per model, prompt length and phase (a foundation module: pure rules).

A sparse-MLA (DSA) layer can compute the same attention in several ways. The lab names four **routes**:

=================  ==========================================================================================
route              what runs (per layer, per rank, ``H`` real heads)
=================  ==========================================================================================
``sparse-mqa``     FlashMLA ``flash_mla_sparse_fwd`` on absorbed Q (head_size 576, d_v 512), padded to 64/128
                   heads: the padded path the placements of :mod:`mla_lab.placement` feed (vLLM
                   ``FLASHMLA_SPARSE``, ``vllm/v1/attention/backends/mla/flashmla_sparse.py``; SGLang
                   ``flashmla_sparse``)
``fa3-sparse``     FlashAttention-3 varlen with ``q_v`` and the top-k indices as a page-size-1 block table, the
                   real heads: no concat, no padded Q, no padded output (vLLM ``FLASH_ATTN_MLA_SPARSE``, PR
                   #46189, merged 2026-06-19, ``vllm/v1/attention/backends/mla/flashattn_mla_sparse.py``;
                   SGLang's ``fa3`` decode backend)
``mha-dense``      dense causal MHA (FlashAttention varlen) on the un-absorbed Q and the K/V up-projected by
                   ``kv_b_proj`` (qk head dim ``qk_nope + qk_rope``, v ``v_head_dim``); the indexer's top-k is
                   skipped (vLLM #47327, merged 2026-07-01, and #51298; SGLang ``_forward_standard_mha``, PR #11892)
``mha-masked``     the same MHA with a mask built from the top-k indices (vLLM #48770, merged 2026-07-15, after the
                   DeepSeek-V3.2 paper's "masked MHA mode to simulate DSA"; GLM-5 dims admitted by #53785 with a
                   FlashAttention ``mask_mod`` kernel and a 128 MiB workspace guard)
=================  ==========================================================================================

**Semantic equivalence.** ``sparse-mqa``, ``fa3-sparse`` and ``mha-masked`` attend exactly the top-k keys the
indexer chose, at any length. ``mha-dense`` attends every earlier key: it equals sparse attention only when top-k
selects every earlier token, i.e. when the sequence (context + prompt so far) has ``seq_len <= topk``. For a
longer sequence dense MHA is an approximation (SGLang PR #30258: "Above 2048: approximation", recall drops past a
model-dependent length), so :func:`check_route` refuses it there.

**Engine rules** (:data:`ENGINE_RULES`, one :class:`EngineRule` each, with the file / PR it follows):

- ``vllm`` for DeepSeek-V3.2 on vLLM's registered MLA layer (``vllm/model_executor/models/deepseek_v2.py`` +
  the sparse backend): when *every* prefill of the batch has ``seq_len <= topk`` -> ``mha-dense`` (#47327,
  "subject to a q_len threshold" whose value the lab does not model: pure prefills only), else the sparse backend's
  route. Masked MHA (#48770) is routed by a backend- and TP-specific threshold table behind an FA4 ``mask_mod``
  kernel; the lab does not place it on sm90 presets and prices it as a modelled alternative.
- ``vllm`` for GLM-5 / GLM-5.2: the NVIDIA DeepSeek-V3.2 attention wrapper (``DeepseekV32Attention``,
  ``vllm/models/deepseek_v32/attention.py``) only calls ``forward_mqa`` and declares itself MQA-only (vLLM #52512,
  merged 2026-08-16, "Do not use Dense MHA for GLM-5.2"): every prefill takes the sparse backend's route. This is
  why the PR #53878 benchmark (1024-token prompts) goes through the padded kernel at all. (#53785 later admitted
  the GLM-5 head dims, 256/256, to the backend's masked-MHA route; the wrapper's MQA-only declaration is what the
  PR's benchmark ran under.)
- the sparse backend's route: ``FLASHMLA_SPARSE`` -> ``sparse-mqa`` (prefill and, with a bf16 KV cache, decode:
  ``mla_attention.py`` sends all tokens down the MQA path); ``FLASH_ATTN_MLA_SPARSE`` -> ``fa3-sparse`` (vLLM's
  Hopper default for head size 576; it precedes ``FLASHMLA_SPARSE`` in the sm90 sparse priority list, vLLM issue
  #56564, which is why the PR's server forces ``--attention-backend FLASHMLA_SPARSE``).
- ``sglang-dense`` (called ``sglang-default`` before; that name is still read, :data:`RULE_ALIASES`): SGLang's
  documented dense route, which SGLang 0.5.23 takes on an H200 only with its prefill CUDA graphs off (its default
  runs short prompts inside breakable prefill graphs on the padded route: ``sglang-0.5.23`` below)
  (sgl-project/sglang ``docs/basic_usage/deepseek_v32.md``, PR #12868 text: "For short
  prefill sequences (default threshold: 2048 tokens), the NSA backend uses standard MHA automatically ... On H200
  (SM90) this path uses the FlashAttention variable-length kernel", MHA_ONE_SHOT; ``dsa_backend.py`` /
  ``nsa_backend.py``; PR #11892): prefill with ``seq_len <= 2048`` (``SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD``,
  a KV length) -> ``mha-dense``; longer -> ``sparse-mqa`` (``_forward_flashmla_sparse``: ``new_zeros`` + copy per
  call); decode -> ``fa3-sparse`` (``nsa_decode_backend`` ``fa3``). ``sglang-flashmla`` forces the padded
  route for every prefill. The 2048 threshold equals ``index_topk`` of both models, so the dense route is exact;
  a threshold above ``topk`` is refused.

**Engine versions** (:mod:`mla_lab.engines`, each fact with its ``file:line`` in the release wheel): the rules
``vllm-0.13.0`` and ``vllm-0.24.0`` (every token down the sparse backend: no dense prefill for either model;
decodes = single-token requests), ``vllm-0.33.0`` (FA3 sparse, vLLM 0.33.0's sm90 bf16 default) and
``vllm-0.33.0-flashmla`` (FLASHMLA_SPARSE forced): GLM-5/5.2 and DeepSeek-V3.2 prefill rows go to ``mha-dense``
when every prefill of the step has ``seq_len <= index_topk`` (``sparse_mla_attention.py:143``), decode rows of the
same step stay sparse; requests of at most ``{16: 128, 32: 128, 64: 256, 128: 256}.get(num_heads, 256)`` query
tokens are decodes (FlashMLA: uniform lengths only). ``sglang-0.5.23``: dense MHA when the batch's longest KV is
``<= 2048``, but never inside a breakable prefill CUDA graph (CUDA default, up to ``min(8192,
chunked_prefill_size)`` = 8192 tokens on an H200): a step of at most 8192 tokens runs ``sparse-mqa``
(``dsa_backend.py:4050``, ``cuda_graph_config.py:123``, ``memory_hook.py:238``).

This module knows no geometry beyond what the caller passes (model name, ``topk``): it sits on the lowest package
layer and imports only :mod:`mla_lab._validate` and :mod:`mla_lab.engines` (the facts its version rules read).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validate import check_int
from .engines import fact

__all__ = ["ROUTES", "PHASES", "ENGINES", "SPARSE_BACKENDS", "ROUTE_SOURCES", "EngineRule", "RouteChoice",
           "ENGINE_RULES", "engine_rule", "check_route", "route_for", "route_table", "model_family", "config_family",
           "ARCHITECTURE_FAMILIES", "MODEL_TYPE_FAMILIES", "FAMILIES",
           "is_equivalent", "SGLANG_DENSE_KV_LEN_THRESHOLD", "RULE_ALIASES"]

ROUTES = ("sparse-mqa", "fa3-sparse", "mha-dense", "mha-masked")
PHASES = ("prefill", "decode")
ENGINES = ("vllm", "sglang")
#: vLLM sparse-MLA backends (``--attention-backend``) and the route each runs for MQA tokens.
SPARSE_BACKENDS = {"FLASHMLA_SPARSE": "sparse-mqa", "FLASH_ATTN_MLA_SPARSE": "fa3-sparse"}
#: SGLang's default dense-MHA KV-length threshold (docs/basic_usage/deepseek_v32.md: 2048 tokens).
SGLANG_DENSE_KV_LEN_THRESHOLD = 2048  # sglang 0.5.23 sglang/srt/environ.py:1983: EnvInt(2048)

ROUTE_SOURCES = {
    "sparse-mqa": "FlashMLA flash_mla_sparse_fwd, h_q padded to 64/128 (csrc/api/sparse_fwd.h); vLLM "
                  "vllm/v1/attention/backends/mla/flashmla_sparse.py",
    "fa3-sparse": "vLLM FLASH_ATTN_MLA_SPARSE (PR #46189, merged 2026-06-19), "
                  "vllm/v1/attention/backends/mla/flashattn_mla_sparse.py: FA3 varlen, q_v, top-k indices as a "
                  "page-size-1 block table, real heads",
    "mha-dense": "vLLM PR #47327 (merged 2026-07-01): dense causal MHA via FlashAttention varlen on kv_b_proj "
                 "up-projected K/V when every prefill has seq_len <= topk; SGLang PR #11892 _forward_standard_mha",
    "mha-masked": "vLLM PR #48770 (merged 2026-07-15): masked MHA (top-k mask) for longer pure prefills; GLM-5 "
                  "dims by PR #53785 (FlashAttention mask_mod, 128 MiB workspace guard)",
}

_NOT_EQUIVALENT = ("dense causal MHA attends every earlier key; sparse attention attends the top-k only, so they "
                   "agree only when seq_len <= topk (DeepSeek-V3.2 paper, masked MHA 'to simulate DSA'; SGLang PR "
                   "#30258: 'Above 2048: approximation')")


#: config.json ``architectures`` -> family: the classes vLLM registers for the two DSA families
#: (``vllm/model_executor/models/registry.py:99,122`` of vLLM 0.24.0: ``DeepseekV32ForCausalLM``,
#: ``GlmMoeDsaForCausalLM``).
ARCHITECTURE_FAMILIES = {"DeepseekV32ForCausalLM": "deepseek", "GlmMoeDsaForCausalLM": "glm"}
#: config.json ``model_type`` -> family, for a config without a known ``architectures`` entry (the HF model types
#: of the same classes: ``deepseek_v32``, ``glm_moe_dsa``).
MODEL_TYPE_FAMILIES = {"deepseek_v32": "deepseek", "glm_moe_dsa": "glm"}
#: The families the engine rules name (``other``: a model no rule names).
FAMILIES = ("deepseek", "glm", "other")


def config_family(architectures=(), model_type: str = "") -> tuple[str, str]:
    """``(family, note)`` of a model from its config.json ``architectures`` (first known entry wins) or, failing
    that, its ``model_type``; never from a folder or model name. ``note`` is "" for a known family, else the
    assumption the lab prices it under (every output shows it): family ``other``, so no engine rule takes its dense
    MHA route and every engine takes its sparse backend route."""
    for a in architectures or ():
        if a in ARCHITECTURE_FAMILIES:
            return ARCHITECTURE_FAMILIES[a], ""
    if model_type in MODEL_TYPE_FAMILIES:
        return MODEL_TYPE_FAMILIES[model_type], ""
    return "other", (f"assumption: architectures={list(architectures or [])} (model_type={model_type!r}) is none "
                     f"of {sorted(ARCHITECTURE_FAMILIES)}, so no engine rule names this model: priced as family "
                     "'other' (every engine takes its sparse backend route, no dense MHA prefill)")


def model_family(model) -> str:
    """``deepseek`` (``DeepseekV32ForCausalLM``), ``glm`` (``GlmMoeDsaForCausalLM``: GLM-5, GLM-5.x) or ``other``
    (a model no engine rule names: it takes no dense route), read from the model's config (its ``family``
    attribute: :attr:`mla_lab.models.ModelConfig.family`, from :func:`config_family`), or one of :data:`FAMILIES`
    given as a str. A model or folder name does not decide the family (issue 32: the same config priced at -33.2 %
    in a folder named glm-96h and +4.4 % in my-96h).

    Raises:
        ValueError: a str that is not a family name; an object without ``family``.
    """
    fam = getattr(model, "family", None)
    if fam is None and isinstance(model, str) and model in FAMILIES:
        fam = model
    if fam not in FAMILIES:
        raise ValueError(f"model={model!r} does not give a family; allowed: a ModelConfig "
                         f"(mla_lab.models.load_model: the family is read from its config.json architectures) or one "
                         f"of {list(FAMILIES)} (a model or folder name does not decide the family)")
    return fam


def is_equivalent(route: str, seq_len: int, topk: int) -> bool:
    """Whether ``route`` computes the same attention as the model's sparse attention for a sequence of
    ``seq_len`` keys (context + the prompt's tokens) and ``topk`` (``index_topk``).

    Raises:
        ValueError: unknown route; seq_len / topk not positive ints.
    """
    _check_route_name(route)
    check_int("seq_len", seq_len)
    check_int("topk", topk)
    return route != "mha-dense" or seq_len <= topk


def check_route(route: str, model_name: str, seq_len: int, topk: int) -> str:
    """``route`` if it is semantically equivalent for ``model_name`` at ``seq_len``; else ValueError.

    Raises:
        ValueError: unknown route; ``mha-dense`` for ``seq_len > topk`` (names the model, the length and the
            source); bad ints.
    """
    if not is_equivalent(route, seq_len, topk):
        raise ValueError(f"route='mha-dense' is refused for model={getattr(model_name, 'name', model_name)!r} at seq_len={seq_len}: "
                         f"not equivalent above topk={topk} ({_NOT_EQUIVALENT}); allowed: seq_len <= {topk}, "
                         f"or routes {[r for r in ROUTES if r != 'mha-dense']}")
    return route


def _check_route_name(route: str) -> None:
    if route not in ROUTES:
        raise ValueError(f"route={route!r} is not valid; allowed: {list(ROUTES)}")


@dataclass(frozen=True)
class RouteChoice:
    """The route one engine takes for one batch: ``route`` (:data:`ROUTES`), ``reason`` (the rule that fired) and
    ``source`` (file / PR)."""

    route: str
    reason: str
    source: str


@dataclass(frozen=True)
class EngineRule:
    """How one engine configuration routes sparse-MLA attention.

    Attributes:
        name: the rule's name (``vllm-flashmla``, ``vllm-fa3``, ``sglang-dense``, ``sglang-flashmla``).
        engine: ``vllm`` or ``sglang``.
        backend_route: the route of MQA tokens (prefill that takes no dense route; decode): ``sparse-mqa`` or
            ``fa3-sparse``.
        decode_route: the route of decode tokens.
        dense_kv_len_threshold: prefills whose seq_len (context + prompt) is at most this go to ``mha-dense``
            (``"topk"``: the model's ``index_topk``; 0: never).
        dense_models: model families allowed the dense route (the others are MQA-only).
        all_prefills: True when the dense route needs *every* prefill of the batch under the threshold (vLLM
            #47327); False when it is decided per request (SGLang's per-batch KV-length check is on the batch's
            longest sequence, the same thing for a batch of one length).
        source: files and PRs the rule follows.
        decode_query_len_threshold: requests whose query length (new tokens this step) is at most this are handled
            as decodes (vLLM's ``reorder_batch_threshold``) and take ``decode_route`` whatever their seq_len: 1024
            for ``FLASH_ATTN_MLA_SPARSE`` (``flashattn_mla_sparse.py`` at commit 0299fca7:
            ``_init_reorder_batch_threshold(1024, supports_spec_as_decode=True)``), 1 otherwise (vLLM's default:
            only single-token requests are decodes; not re-checked for ``flashmla_sparse.py`` at the PR's date);
            the default of :attr:`decode_thresholds` for the engine-version rules.
        decode_thresholds: ``((num_heads, n), ...)``: the per-head-count thresholds of vLLM 0.33.0's sparse backends
            (``{16: 128, 32: 128, 64: 256, 128: 256}.get(num_q_heads, 256)``; :meth:`decode_threshold`).
        uniform_decodes: decodes must share one query length (vLLM ``require_uniform_decodes``: FLASHMLA_SPARSE in
            0.33.0); a short request of another length than the first short one is a prefill.
        prefill_graph_max_tokens: steps of at most this many tokens run inside a prefill CUDA graph where the dense
            route is off (SGLang 0.5.23's breakable prefill graphs: ``use_mha = False``); 0: no such graph.
        mqa_only_reason: why a model family outside ``dense_models`` takes the backend route (shown in the reason).
    """

    name: str
    engine: str
    backend_route: str
    decode_route: str
    dense_kv_len_threshold: int | str
    dense_models: tuple
    all_prefills: bool
    source: str
    decode_query_len_threshold: int = 1
    decode_thresholds: tuple = ()
    uniform_decodes: bool = False
    prefill_graph_max_tokens: int = 0
    mqa_only_reason: str = ""

    def decode_threshold(self, num_heads: int | None = None) -> int:
        """Query tokens per request still handled as a decode at ``num_heads`` heads per rank
        (``{heads: n}.get(num_heads, decode_query_len_threshold)``; None: the default)."""
        return dict(self.decode_thresholds).get(num_heads, self.decode_query_len_threshold)

    def dense_threshold(self, topk: int) -> int:
        """The dense route's seq_len threshold for a model with ``topk`` (0: no dense route)."""
        return topk if self.dense_kv_len_threshold == "topk" else int(self.dense_kv_len_threshold)


_VLLM_SRC = ("vLLM PR #47327 (dense MHA when every prefill has seq_len <= topk; DeepSeek-V3.2 on the registered "
             "MLA layer), PR #52512 (merged 2026-08-16: the NVIDIA DeepseekV32Attention wrapper GLM-5/5.2 run "
             "through is MQA-only)")
ENGINE_RULES = {
    "vllm-flashmla": EngineRule(
        "vllm-flashmla", "vllm", "sparse-mqa", "sparse-mqa", "topk", ("deepseek",), True,
        _VLLM_SRC + "; --attention-backend FLASHMLA_SPARSE: flashmla_sparse.py, bf16 KV cache decode also padded "
        "(mla_attention.py sends all tokens down the MQA path)"),
    "vllm-flashmla-mqa": EngineRule(
        "vllm-flashmla-mqa", "vllm", "sparse-mqa", "sparse-mqa", 0, (), True,
        "vLLM FLASHMLA_SPARSE before PR #47327 (release wheels 0.13.0, 2025-12-19, and 0.24.0, 2026-06-29: "
        "vllm/v1/attention/backends/mla/flashmla_sparse.py has no dense-MHA prefill; every prefill and decode token "
        "goes through the padded sparse kernel, `q.new_empty((T, padding, 576))` per call: 0.13.0 line 936, "
        "0.24.0 line 841)"),
    "vllm-fa3": EngineRule(
        "vllm-fa3", "vllm", "fa3-sparse", "fa3-sparse", "topk", ("deepseek",), True,
        _VLLM_SRC + "; FLASH_ATTN_MLA_SPARSE (PR #46189, flashattn_mla_sparse.py at 0299fca7: FA3 varlen, q=q_rope, "
        "q_v=q_nope, max_seqlen_q=1, block_table=top-k indices; requests of <= 1024 query tokens handled as "
        "decodes), vLLM's sm90 default for head size 576 (sparse priority list quoted in vLLM issue #56564)", 1024),
    "sglang-dense": EngineRule(
        "sglang-dense", "sglang", "sparse-mqa", "fa3-sparse", SGLANG_DENSE_KV_LEN_THRESHOLD, ("deepseek", "glm"),
        False,
        "SGLang's documented dense route, prefill CUDA graphs off (not SGLang 0.5.23's H200 default, which runs "
        "short prompts in breakable prefill graphs on the padded route: rule sglang-0.5.23); "
        "sgl-project/sglang docs/basic_usage/deepseek_v32.md (PR #12868: dense MHA below 2048 tokens, FlashAttention "
        "varlen on H200, MHA_ONE_SHOT), PR #11892 (_forward_standard_mha), dsa_backend.py "
        "(_forward_flashmla_sparse: new_zeros + copy per call; decode backend fa3)"),
    "sglang-flashmla": EngineRule(
        "sglang-flashmla", "sglang", "sparse-mqa", "sparse-mqa", 0, (), False,
        "SGLang with the padded route forced for every prefill and decode (nsa prefill/decode backend "
        "flashmla_sparse; _forward_flashmla_sparse new_zeros + copy per call)"),
}


def _version_rule(name: str, preset: str, backend: str, backend_route: str, decode_route: str, dense, models,
                  all_prefills: bool, why: str, graph_tokens: int = 0) -> EngineRule:
    """A rule built from an engine preset's facts (:mod:`mla_lab.engines.versions`; ``decode_threshold`` of
    ``backend`` on sm90)."""
    pairs, default = fact(preset, "decode_threshold").value[backend]["sm90"]
    src = f"{preset}: " + "; ".join(f"{f.key} ({f.cite()})" for f in
                                    (fact(preset, k) for k in ("prefill_route", "decode_threshold")))
    return EngineRule(name, preset.split("@")[0], backend_route, decode_route, dense, models, all_prefills, src,
                      default, tuple(pairs), preset == "vllm@0.33.0-flashmla", graph_tokens, why)


ENGINE_RULES.update({
    "vllm-0.13.0": _version_rule("vllm-0.13.0", "vllm@0.13.0", "FLASHMLA_SPARSE", "sparse-mqa", "sparse-mqa", 0, (),
                                 True, "vLLM 0.13.0: FlashMLASparseImpl.forward sends every token to the sparse "
                                 "kernel"),
    "vllm-0.24.0": _version_rule("vllm-0.24.0", "vllm@0.24.0", "FLASHMLA_SPARSE", "sparse-mqa", "sparse-mqa", 0, (),
                                 True, "vLLM 0.24.0: sparse MLA impls send every token down forward_mqa"),
    "vllm-0.33.0": _version_rule("vllm-0.33.0", "vllm@0.33.0", "FLASH_ATTN_MLA_SPARSE", "fa3-sparse", "fa3-sparse",
                                 "topk", ("deepseek", "glm"), True, ""),
    "vllm-0.33.0-flashmla": _version_rule("vllm-0.33.0-flashmla", "vllm@0.33.0-flashmla", "FLASHMLA_SPARSE",
                                          "sparse-mqa", "sparse-mqa", "topk", ("deepseek", "glm"), True, ""),
    "sglang-0.5.23": EngineRule(
        "sglang-0.5.23", "sglang", "sparse-mqa", "fa3-sparse", SGLANG_DENSE_KV_LEN_THRESHOLD,
        ("deepseek", "glm"), False, "sglang@0.5.23: " + "; ".join(
            f"{k} ({fact('sglang@0.5.23', k).cite()})" for k in ("prefill_route", "cuda_graph", "pad_call")),
        1, (), False, fact("sglang@0.5.23", "cuda_graph").value["prefill_graph_max_tokens"], ""),
})


#: The lab's packed kernel (:mod:`mla_lab.kernels.packed`; strategy ``packed``): every prefill on the packed sparse
#: path (no dense-MHA route of its own: the lab built none), decode tokens per token on vLLM 0.33.0's FA3 sparse
#: (``FLASH_ATTN_MLA_SPARSE``: a decode step's tokens belong to different requests, nothing to pack); only
#: single-token requests are decodes (no engine's reorder threshold: an assumption of the lab's, not a code reading).
ENGINE_RULES["mla_lab-packed"] = EngineRule(
    "mla_lab-packed", "mla_lab", "sparse-mqa", "fa3-sparse", 0, (), True,
    "the lab's packed kernel (mla_lab/kernels/packed.py, not in any engine): prefill packed, decode vLLM 0.33.0 "
    "FLASH_ATTN_MLA_SPARSE per token", mqa_only_reason="the packed kernel has no dense-MHA route of its own")

#: Rule names read at the door for an older name: ``sglang-default`` was the lab's name for SGLang's documented
#: dense route before SGLang 0.5.23's default was read (issue 32: it is not SGLang's default today).
RULE_ALIASES = {"sglang-default": "sglang-dense"}


def engine_rule(name: str) -> EngineRule:
    """The :class:`EngineRule` named ``name`` (an old name of :data:`RULE_ALIASES` is read as its new one).
    Raises ValueError naming the allowed rules."""
    name = RULE_ALIASES.get(name, name)
    if name not in ENGINE_RULES:
        raise ValueError(f"engine rule={name!r} is not valid; allowed: {list(ENGINE_RULES)}")
    return ENGINE_RULES[name]


def route_for(rule: str | EngineRule, model_name: str, topk: int, phase: str = "prefill",
              seq_lens=None, query_lens=None, num_heads: int | None = None) -> RouteChoice:
    """The route ``rule`` takes for a batch of ``model_name`` (``topk`` = ``index_topk``).

    Args:
        rule: a name of :data:`ENGINE_RULES` or an :class:`EngineRule`.
        model_name: the model's :class:`~mla_lab.models.ModelConfig` (its config decides the family,
            :func:`model_family`: GLM is MQA-only on vLLM, #52512) or a family name of :data:`FAMILIES`.
        topk: the model's ``index_topk`` (2048 for GLM-5 and DeepSeek-V3.2).
        phase: ``prefill`` or ``decode``.
        seq_lens: prefill only: each prefill's seq_len (context + its tokens so far, i.e. the keys its last token
            sees); an int for a batch of one length.
        query_lens: each request's new tokens this step (default ``seq_lens``: fresh prompts, no context); requests
            at or below the rule's decode threshold (:meth:`EngineRule.decode_threshold` at ``num_heads``) are
            handled as decodes (with ``uniform_decodes``: only those of the first short request's length).
        num_heads: attention heads per rank (None: the rule's default threshold).

    Returns:
        A :class:`RouteChoice`; the dense route is chosen only where it is equivalent (:func:`is_equivalent`) for
        every row of the step, its decode tokens included (they are priced on the step's route).

    Raises:
        ValueError: unknown rule / phase; prefill without ``seq_lens``; a length not a positive int; a rule
            whose dense threshold exceeds ``topk`` (that route would not be equivalent).
    """
    r = rule if isinstance(rule, EngineRule) else engine_rule(rule)
    fam = model_family(model_name)
    check_int("topk", topk)
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not valid; allowed: {list(PHASES)}")
    if phase == "decode":
        return RouteChoice(r.decode_route, f"{r.name}: decode tokens take {r.decode_route}", r.source)
    if seq_lens is None:
        raise ValueError("seq_lens=None: a prefill route needs each prefill's seq_len (an int or a list of ints)")
    lens = [seq_lens] if isinstance(seq_lens, int) and not isinstance(seq_lens, bool) else list(seq_lens)
    if not lens:
        raise ValueError("seq_lens=[] is empty; allowed: at least one positive int")
    for s in lens:
        check_int("seq_len", s)
    qlens = lens if query_lens is None else (
        [query_lens] if isinstance(query_lens, int) and not isinstance(query_lens, bool) else list(query_lens))
    if len(qlens) != len(lens):
        raise ValueError(f"query_lens has {len(qlens)} entries for {len(lens)} seq_lens; allowed: one per request")
    for q, s in zip(qlens, lens):
        check_int("query_len", q)
        if q > s:
            raise ValueError(f"query_len={q} exceeds its seq_len={s}; allowed: query_len <= seq_len")
    dthr = r.decode_threshold(num_heads)
    short = [q for q in qlens if q <= dthr]
    uni = short[0] if (r.uniform_decodes and short) else None
    prefills = [s for q, s in zip(qlens, lens) if q > dthr or (uni is not None and q != uni)]
    every = max(lens)  # SGLang decides per batch: its decode tokens' KV lengths count too
    if not prefills:
        return RouteChoice(r.decode_route, f"{r.name}: every request has <= {dthr} query "
                           f"tokens, handled as decodes: {r.decode_route}", r.source)
    lens = prefills
    thr = r.dense_threshold(topk)
    if thr > topk:
        raise ValueError(f"rule {r.name!r} has dense_kv_len_threshold={thr} > topk={topk}: dense MHA would not be "
                         f"equivalent ({_NOT_EQUIVALENT}); allowed: a threshold <= topk")
    if r.prefill_graph_max_tokens and sum(qlens) <= r.prefill_graph_max_tokens and fam in r.dense_models:
        return RouteChoice(r.backend_route, f"{r.name}: the step's {sum(qlens)} tokens run inside a breakable "
                           f"prefill CUDA graph (<= {r.prefill_graph_max_tokens} tokens), where the dense route is "
                           f"off (use_mha = False): {r.backend_route}", r.source)
    if fam not in r.dense_models or thr == 0:
        why = (r.mqa_only_reason if r.mqa_only_reason and fam != "other"
               else "MQA-only attention wrapper (vLLM #52512)" if r.engine == "vllm" and fam == "glm"
               else "no engine rule names this model" if fam == "other" else "no dense route in this configuration")
        return RouteChoice(r.backend_route, f"{r.name}: {getattr(model_name, 'name', model_name)} prefill takes {r.backend_route} ({why})",
                           r.source)
    longest = max(lens)
    if not r.all_prefills and longest <= thr < every:  # SGLang's per-batch max_kv_len: a decode past top-k keeps
        # the batch off dense MHA (vLLM #47327 routes prefill rows alone: its decode rows take the sparse route)
        return RouteChoice(r.backend_route, f"{r.name}: every prefill has seq_len <= {thr} but a decode of the "
                           f"same step has seq_len {every} > {thr} (dense MHA is exact only up to topk): "
                           f"{r.backend_route}", r.source)
    if longest <= thr:
        return RouteChoice("mha-dense", f"{r.name}: every prefill has seq_len <= {thr} (longest {longest})",
                           r.source)
    scope = "every prefill" if r.all_prefills else "the batch's longest prefill"
    return RouteChoice(r.backend_route, f"{r.name}: {scope} not under seq_len {thr} (longest {longest}): "
                       f"{r.backend_route}", r.source)


def route_table(rule: str | EngineRule, model_name: str, topk: int, prompt_lens=(512, 1024, 2048, 4096, 8192)):
    """``[{prompt_len, prefill_route, decode_route}]`` for single-length batches of fresh prompts (no prefix
    cache: seq_len = prompt_len). Raises as :func:`route_for`."""
    out = []
    for L in prompt_lens:
        out.append({"prompt_len": L, "prefill_route": route_for(rule, model_name, topk, "prefill", L, L).route,
                    "decode_route": route_for(rule, model_name, topk, "decode").route})
    return out
