"""Engine versions as an axis: each engine release (or PR-era build) the lab describes, and its facts as data.

An :class:`EngineVersion` is (engine, version, release date, the source files read). An :class:`EnginePreset` is
one way to run that version (``vllm@0.33.0`` = vLLM 0.33.0's defaults; ``vllm@0.33.0-flashmla`` = the same with
``--attention-backend FLASHMLA_SPARSE`` forced, as PR #53878's server forced it). Each preset carries its
:class:`Fact` s: the backend chosen per GPU (sm90 / sm100) x KV dtype (bf16 / fp8) x heads per rank, the prefill
route and its threshold, the indexer skip, ``prefill_padding``, the workspace shapes and what is reserved, the
decode thresholds (query tokens per request still counted as a decode) and the CUDA-graph mode; every fact names the
``file:line`` inside the release wheel it comes from (:class:`Source`) and the code it rests on, which
:mod:`mla_lab.engines.wheel_check` finds again with :mod:`ast` in the wheel.

Presets (``mla-lab engines`` lists them; ``docs/engines.md`` has the table):

===========================  =========================================================================================
``vllm@pr53878-before``      vLLM main in mid-2026, the path PR #53878 replaced: private ``(max_num_batched_tokens,
                             num_heads, 576)`` Q buffer, ``concat_mla_q`` into it, a ``new_empty((T, 64, 576))`` pad
                             + copy per call; GLM-5/5.2 MQA-only (vLLM #52512). No release wheel: PR-era file.
``vllm@pr53878``             PR #53878: the Q-concat workspace pre-padded to 64 heads, private (never written: zeros)
``vllm@56902``               PR #56902 (merged 2026-09-14): the padded view taken per call from the shared workspace
``vllm@0.13.0``              release 0.13.0 (wheel built 2025-12-19): ``torch.cat`` Q + ``new_empty`` pad; every token
                             down FlashMLA sparse; GLM-5 not registered
``vllm@0.24.0``              release 0.24.0 (wheel built 2026-06-29): the pre-PR placement (private unpadded buffer,
                             ``concat_mla_q``, ``new_empty`` pad); sparse impls send every token down ``forward_mqa``
``vllm@0.33.0``              release 0.33.0 (wheel built 2026-11-01), defaults: sm90 bf16 -> FA3 sparse (real heads);
                             GLM-5/5.2 and DeepSeek-V3.2 prefill rows dense MHA when every prefill has
                             ``seq_len <= index_topk``
``vllm@0.33.0-flashmla``     the same with FLASHMLA_SPARSE forced: bf16 Q a per-call view of the shared workspace
                             padded to 64 (sm90 and sm100); on 1024-token prompts only decode rows reach it
``sglang@0.5.23``            SGLang 0.5.23 (wheel built 2026-10-30) on H200: breakable prefill CUDA graphs up to
                             ``min(8192, chunked_prefill_size)`` tokens force ``use_mha = False``: the indexer +
                             ``flashmla_sparse`` with a ``new_zeros`` pad (64 on sm90, 128 on sm100); decode ``fa3``
===========================  =========================================================================================

The lab's strategies of each preset (placement x route rule) are in :data:`mla_lab.placement.ENGINE_PRESET_MEMBERS`.
The PR-era presets keep the lab's first names at the door (:data:`mla_lab.placement.ENGINE_LEGACY_NAMES`:
``vllm-53878`` ->
``vllm@pr53878`` ...). ``vllm-fa3-sparse`` and ``sglang`` name today's engines there (``vllm@0.33.0``,
``sglang@0.5.23``); as *strategy* presets (:data:`mla_lab.placement.PRESETS`) they keep their measured meaning.

This module is a foundation (stdlib only): :mod:`mla_lab.routes` builds its engine rules from these facts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Source", "Fact", "EngineVersion", "EnginePreset", "ENGINE_VERSIONS", "ENGINE_PRESETS",
           "engine_version", "engine_preset", "resolve_engine", "engine_names", "fact", "version_facts",
           "sparse_backend", "padding_for", "decode_threshold", "BACKENDS", "UNPADDED_BACKENDS", "LAB_CLAIMS",
           "fp8_reserved_bytes"]


@dataclass(frozen=True)
class Source:
    """Where a fact is written: ``path`` inside the wheel (or a PR's file), ``line`` (``"754"`` / ``"766-777"``),
    ``scope`` (``"Cls.method"``, ``"function"``, a module-level variable, ``""`` the module) and ``code``: one
    Python statement or expression that :mod:`mla_lab.engines.wheel_check` must find in that scope (ast).
    ``checkable`` False: a PR-era source with no release wheel (cited, not checked)."""

    path: str
    line: str
    code: str
    scope: str = ""
    checkable: bool = True

    def cite(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Fact:
    """One fact a preset relies on: ``key`` (``prefill_padding.sm90``, ``backend.sm90.bf16`` ...), ``value`` (what
    the lab uses), ``text`` (one sentence) and its ``sources``."""

    key: str
    value: object
    text: str
    sources: tuple = ()

    def cite(self) -> str:
        return "; ".join(s.cite() for s in self.sources)


@dataclass(frozen=True)
class EngineVersion:
    """An engine release or PR-era build: ``engine`` (``vllm`` / ``sglang``), ``version``, ``release_date``
    (ISO date: the wheel's build date for releases, the merge date for PRs), ``wheel`` (the release wheel's file
    name stem, None for PR-era builds) and ``models`` (model families it runs as DSA: ``deepseek`` / ``glm``)."""

    engine: str
    version: str
    release_date: str
    wheel: str | None
    models: tuple = ("deepseek", "glm")
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.engine}@{self.version}"


@dataclass(frozen=True)
class EnginePreset:
    """One way to run an engine version.

    Attributes:
        name: ``<engine>@<version>[-<variant>]``.
        engine_version: the :class:`EngineVersion`.
        summary: one line.
        route_rule: the :data:`mla_lab.routes.ENGINE_RULES` name its steps are routed by.
        forced_backend: the ``--attention-backend`` the preset forces (None: the engine's own choice).
        facts: its :class:`Fact` s.
    """

    name: str
    engine_version: EngineVersion
    summary: str
    route_rule: str
    forced_backend: str | None
    facts: tuple

    def fact(self, key: str) -> Fact:
        for f in self.facts:
            if f.key == key:
                return f
        raise ValueError(f"preset {self.name!r} has no fact {key!r}; it has: {[f.key for f in self.facts]}")

    def has(self, key: str) -> bool:
        return any(f.key == key for f in self.facts)

    @property
    def sources(self) -> list[str]:
        """Every file the preset's facts cite, in order, once."""
        return list(dict.fromkeys(s.path for f in self.facts for s in f.sources))


#: Sparse-MLA backends (vLLM's ``--attention-backend`` spellings; SGLang's ``flashmla_sparse`` is FLASHMLA_SPARSE):
#: the GPUs (sm major) and KV dtypes each runs (vLLM 0.33.0 ``supports_compute_capability`` /
#: ``supported_kv_cache_dtypes`` of each backend class).
BACKENDS = {
    "FLASH_ATTN_MLA_SPARSE": ({9}, {"bf16"}),
    "FLASH_ATTN_MLA_SPARSE_FA4": ({10}, {"bf16"}),
    "FLASHINFER_MLA_SPARSE": ({10}, {"bf16", "fp8"}),
    "FLASHINFER_MLA_SPARSE_SM90": ({9}, {"bf16", "fp8"}),
    "FLASHMLA_SPARSE": ({9, 10}, {"bf16", "fp8"}),
}
#: Backends that take the real head count (no padded Q, no padded output).
UNPADDED_BACKENDS = ("FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE")

_FM = "vllm/v1/attention/backends/mla/flashmla_sparse.py"
_FA = "vllm/v1/attention/backends/mla/flashattn_mla_sparse.py"
_CUDA = "vllm/platforms/cuda.py"
_REG = "vllm/model_executor/models/registry.py"
_IMPL = "FlashMLASparseImpl.__init__"
_BLD = "FlashMLASparseMetadataBuilder"
_E = "AttentionBackendEnum"


def _src(path, line, code, scope=""):
    return Source(path, line, code, scope)


def _pr(path, line, code, scope=""):
    return Source(path, line, code, scope, checkable=False)


def _list(*names):
    return "[" + ", ".join(f"{_E}.{n}" for n in names) + "]"


# ---------------------------------------------------------------------------------------------- engine versions
V_PRE = EngineVersion("vllm", "pr53878-before", "2026-08-27", None, ("deepseek", "glm"),
                      "vLLM main on PR #53878's merge-base (no release wheel)")
V_PR = EngineVersion("vllm", "pr53878", "2026-08-27", None, ("deepseek", "glm"),
                     "vLLM PR #53878, merged on or after 2026-08-27 (no release wheel)")
V_56902 = EngineVersion("vllm", "56902", "2026-09-14", None, ("deepseek", "glm"),
                        "vLLM PR #56902, merged 2026-09-14 (no release wheel)")
V_013 = EngineVersion("vllm", "0.13.0", "2025-12-19", "vllm-0.13.0", ("deepseek",),
                      "GlmMoeDsaForCausalLM is not in its model registry")
V_024 = EngineVersion("vllm", "0.24.0", "2026-06-29", "vllm-0.24.0")
V_033 = EngineVersion("vllm", "0.33.0", "2026-11-01", "vllm-0.33.0")
S_0523 = EngineVersion("sglang", "0.5.23", "2026-10-30", "sglang-0.5.23")
ENGINE_VERSIONS = {v.name: v for v in (V_PRE, V_PR, V_56902, V_013, V_024, V_033, S_0523)}

# ---------------------------------------------------------------------------------------------- shared facts
_PRE_SRC = "vllm/v1/attention/backends/mla/flashmla_sparse.py (PR #53878's merge-base)"
_PR_ERA_PADDING = Fact("prefill_padding", {"sm90": 64, "sm100": 128},
                       "the bf16 sparse prefill pads heads to 64 on Hopper, 128 on Blackwell (capability family 100)",
                       (_pr(_PRE_SRC, "-", "self.prefill_padding = 128 if "
                            "current_platform.is_device_capability_family(100) else 64", _IMPL),))
_PR_ERA_ROUTE = Fact("prefill_route", {"deepseek": "dense-if-every-prefill<=topk", "glm": "sparse-mqa"},
                     "DeepSeek-V3.2 prefills go dense MHA when every prefill has seq_len <= topk (vLLM #47327); "
                     "GLM-5/5.2 run through the MQA-only DeepseekV32Attention wrapper (vLLM #52512)",
                     (_pr("vllm/models/deepseek_v32/attention.py (PR #52512)", "-", "pass"),))
_PR_ERA_DECODE = Fact("decode_threshold", {"FLASHMLA_SPARSE": {"sm90": ((), 1), "sm100": ((), 1)},
                                           "FLASH_ATTN_MLA_SPARSE": {"sm90": ((), 1024)}},
                      "query tokens per request still handled as a decode: 1 for FLASHMLA_SPARSE (vLLM's default), "
                      "1024 for FLASH_ATTN_MLA_SPARSE (flashattn_mla_sparse.py at 0299fca7)",
                      (_pr(_FA + " (0299fca7)", "-", "self._init_reorder_batch_threshold(1024, "
                           "supports_spec_as_decode=True)"),))
_PR_ERA_BACKENDS = Fact("backend_priority", {"sm90": {"bf16": ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                                      "fp8": ("FLASHMLA_SPARSE",)},
                                             "sm100": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)}},
                        "sm90 sparse priority FA3 sparse before FLASHMLA_SPARSE (vLLM issue #56564, 0.28.x)",
                        (_pr(_CUDA + " (0.28.x, vLLM issue #56564)", "-", "pass"),))
_CG_UNIFORM = "uniform decode batches as full CUDA graphs (AttentionCGSupport.UNIFORM_BATCH); mixed and prefill " \
              "batches piecewise, attention eager"
_PR_ERA_CG = Fact("cuda_graph", _CG_UNIFORM, "FlashMLA sparse declares AttentionCGSupport.UNIFORM_BATCH",
                  (_pr(_PRE_SRC, "-", "pass"),))
_PR_ERA_INDEXER = Fact("indexer_skip", "never", "the indexer runs on every DSA layer's step (GLM-5.2: the layers "
                       "carrying one, index_topk_freq 4)", (_pr(_PRE_SRC, "-", "pass"),))

# ---------------------------------------------------------------------------------------------- vLLM 0.33.0
_V33_PAD = Fact("prefill_padding", {"sm90": 64, "sm100": 64},
                "\"Prefill BF16 kernel requires 64 heads on Hopper and Blackwell\": prefill_padding 64 on both",
                (_src(_FM, "754", "self.prefill_padding = 64", _IMPL),))
_V33_WS = Fact("workspace.bf16", "(max_num_batched_tokens, round_up(num_heads, 64), 576) bf16, a view of the shared "
               "workspace taken per call at offset 0; concat_mla_q writes the real heads, nothing zeroes the rest",
               "bf16 KV: q_concat_heads = round_up(num_heads, prefill_padding), the Q buffer a per-call view of the "
               "shared workspace (vllm/v1/worker/workspace.py: torch.empty, not zeroed)",
               (_src(_FM, "771-775", "q_concat_heads = (num_heads + self.prefill_padding - 1) // "
                     "self.prefill_padding * self.prefill_padding", _IMPL),
                _src(_FM, "1420-1422", "q_concat_buffer, *_ = current_workspace_manager().get_simultaneous("
                     "*self.workspace_specs)", "FlashMLASparseImpl.forward_mqa"),
                _src(_FM, "1431", "ops.concat_mla_q(ql_nope, q_pe, q)", "FlashMLASparseImpl.forward_mqa")))
_V33_WS_FP8 = Fact("workspace.fp8", ("(max_num_batched_tokens, num_heads, 576)",
                                     "(factor * max_model_len, 576)",
                                     "(max_num_batched_tokens, round_up(num_heads, 64), 576)",
                                     "(max_num_batched_tokens, round_up(num_heads, 64), 512)",
                                     "(max_num_batched_tokens, num_heads, 512)"),
                   "fp8 KV: __init__ also reserves (all bf16, from the shared workspace) the prefill gather "
                   "workspace of factor x max_model_len rows (factor 5 when max_model_len <= 256K, else 2), a padded "
                   "Q, a padded output and an unpadded output",
                   (_src(_FM, "810", "self.prefill_workspace_shape = (shard_rows, self.q_head_size)", _IMPL),
                    _src(_FM, "822-829", "self.workspace_specs.extend(((shape, torch.bfloat16) for shape in "
                         "((max_tokens, padded_prefill_query_heads, self.q_head_size), (max_tokens, "
                         "padded_prefill_query_heads, self.kv_lora_rank), (max_tokens, prefill_query_heads, "
                         "self.kv_lora_rank))))", _IMPL),
                    _src(_FM, "832", "current_workspace_manager().get_simultaneous(*self.workspace_specs)", _IMPL),
                    _src("vllm/config/vllm.py", "1872-1874", "self.attention_config."
                         "sparse_mla_prefill_workspace_factor = 5 if self.model_config.max_model_len <= 256 * 1024 "
                         "else 2")))
_V33_PADCALL = Fact("pad_call", "new_empty", "without a pre-padded buffer (out=None) _bf16_flash_mla_kernel pads "
                    "with q.new_empty((T, padded_num_heads, 576)) + copy",
                    (_src(_FM, "1382", "q_padded = q.new_empty((q.shape[0], padded_num_heads, q.shape[2]))",
                          "FlashMLASparseImpl._bf16_flash_mla_kernel"),))
_V33_DECODE = Fact("decode_threshold",
                   {"FLASHMLA_SPARSE": {"sm90": (((16, 128), (32, 128), (64, 256), (128, 256)), 256),
                                        "sm100": (((8, 128), (16, 128), (32, 128), (64, 256), (128, 1024)), 1024)},
                    "FLASH_ATTN_MLA_SPARSE": {"sm90": (((16, 128), (32, 128), (64, 256), (128, 256)), 256)}},
                   "query tokens per request handled as a decode ({heads: n}.get(num_heads, default)): FA3 sparse "
                   "256 at 8 heads, 128 at 16; FlashMLA the same on sm90 with uniform-length decodes only "
                   "(require_uniform_decodes)",
                   (_src(_FM, "371", "threshold = {16: 128, 32: 128, 64: 256, 128: 256}.get(num_q_heads, 256)",
                         _BLD + ".__init__"),
                    _src(_FM, "367-369", "threshold = {8: 128, 16: 128, 32: 128, 64: 256, 128: 1024}.get("
                         "num_q_heads, 1024)", _BLD + ".__init__"),
                    _src(_FM, "351", "require_uniform_decodes: ClassVar[bool] = True", _BLD),
                    _src(_FA, "142", "threshold = {16: 128, 32: 128, 64: 256, 128: 256}.get(num_q_heads, 256)",
                         "FlashAttnMLASparseMetadataBuilder.__init__"),
                    _src("vllm/v1/attention/backends/utils.py", "892",
                         "is_prefill = (query_lens != query_lens[0]) & (query_lens != 0)",
                         "split_decodes_and_prefills")))
_V33_BACKENDS = Fact("backend_priority",
                     {"sm90": {"bf16": ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90"),
                               "fp8": ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90")},
                      "sm100": {"fp8": ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                "bf16<=16": ("FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                "bf16>16": ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE")}},
                     "sparse backend order: sm90 FA3 sparse (bf16 KV only), FLASHMLA_SPARSE, FlashInfer SM90; sm100 "
                     "fp8 KV FlashInfer then FlashMLA; bf16 KV <= 16 heads FA4 sparse first (\"FlashMLA uses "
                     "padding\"), > 16 heads FlashMLA first",
                     (_src(_CUDA, "138-141", "sparse_tail = " + _list("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"),
                           "_get_backend_priorities"),
                      _src(_CUDA, "101-104", "sparse_backends = " + _list("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                           "_get_backend_priorities"),
                      _src(_CUDA, "109-113", "sparse_backends = " + _list(
                          "FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                          "_get_backend_priorities"),
                      _src(_CUDA, "110", "num_heads is not None and num_heads <= 16", "_get_backend_priorities"),
                      _src(_CUDA, "115-118", "sparse_backends = " + _list("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"),
                           "_get_backend_priorities"),
                      _src(_FA, "83", "return capability.major == 9", "FlashAttnMLASparseBackend"),
                      _src(_FA, "98", "kv_cache_dtype not in (None, 'auto', 'float16', 'bfloat16')",
                           "FlashAttnMLASparseBackend.supports_combination")))
_V33_ROUTE = Fact("prefill_route", {"deepseek": "dense-if-every-prefill<=topk", "glm": "dense-if-every-prefill<=topk"},
                  "GlmMoeDsaForCausalLM maps to vllm.models.deepseek_v32, whose MLA attention has a dense-MHA "
                  "prefill (FlashAttention varlen on sm90): prefill rows go dense when every prefill of the step has "
                  "seq_len <= index_topk (HiSparse off, sparse_mla_force_mqa False, the default); decode rows of the "
                  "same step take the sparse backend",
                  (_src(_REG, "126", "{'GlmMoeDsaForCausalLM': ('vllm.models.deepseek_v32', 'GlmMoeDsaForCausalLM')}",
                        "_TEXT_GENERATION_MODELS"),
                   _src("vllm/model_executor/layers/attention/mla_attention.py", "440",
                        "supports_dense_mha_prefill: ClassVar[bool] = True", "MLAAttention"),
                   _src("vllm/model_executor/layers/attention/sparse_mla_attention.py", "143",
                        "prefill_max_seq_len <= topk_tokens", "_use_dense_mha_prefill"),
                   _src("vllm/model_executor/layers/attention/sparse_mla_attention.py", "278",
                        "topk_tokens = model_config.hf_text_config.index_topk"),
                   _src("vllm/config/attention.py", "135", "sparse_mla_force_mqa: bool = False", "AttentionConfig"),
                   _src("vllm/platforms/interface.py", "482", "priorities = [MLAPrefillBackendEnum.FLASH_ATTN]",
                        "Platform.get_mla_prefill_backend_cls")))
_V33_INDEXER = Fact("indexer_skip", "pure-prefill steps whose prefills all go dense, outside full CUDA graphs",
                    "the indexer's top-k is skipped only when the step is pure prefill (no decode tokens), its "
                    "prefills take dense MHA and the step is not a full CUDA graph",
                    (_src("vllm/models/deepseek_v32/attention.py", "227-233", "enable_short_prefill_scoring_skip = "
                          "not is_mtp_layer and not skip_topk and not self.use_pcp and current_platform.is_cuda() "
                          "and self.supports_dense_mha_prefill", "DeepseekV32Attention.__init__"),
                     _src("vllm/model_executor/layers/sparse_attn_indexer.py", "583",
                          "forward_context.cudagraph_runtime_mode != CUDAGraphMode.FULL"),
                     _src("vllm/model_executor/layers/sparse_attn_indexer.py", "590",
                          "getattr(mla_metadata, 'num_decode_tokens', -1) == 0")))
_V33_CG = Fact("cuda_graph", "breakable CUDA graphs for DSA models (torch.compile off); sparse backends declare "
               "UNIFORM_BATCH (uniform decode batches as full graphs)",
               "GlmMoeDsaForCausalLM and DeepseekV32ForCausalLM are in DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES",
               (_src("vllm/config/vllm.py", "76-107", "frozenset({'GlmMoeDsaForCausalLM', 'DeepseekV32ForCausalLM'})",
                     "DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES"),
                _src(_FM, "350", "_cudagraph_support: ClassVar[AttentionCGSupport] = "
                     "AttentionCGSupport.UNIFORM_BATCH", _BLD),
                _src(_FA, "128", "_cudagraph_support: ClassVar[AttentionCGSupport] = "
                     "AttentionCGSupport.UNIFORM_BATCH", "FlashAttnMLASparseMetadataBuilder")))
_V33_KV = Fact("default_kv.sm100", "fp8", "GLM (GlmMoeDsaForCausalLM) defaults to an fp8 KV cache on sm100 when the "
               "KV dtype is 'auto'", (_src("vllm/model_executor/models/config.py", "100",
                                           "cache_config.cache_dtype = 'fp8_e4m3'",
                                           "GlmMoeDsaForCausalLM.verify_and_update_config"),))
_V33_FA3 = Fact("fa3_call", "flash_attn_varlen_func(q=q_rope, k=k_pe cache, v=latent cache, q_v=q_nope, "
                "block_table=top-k indices, seqused_k, fa_version=3)", "FA3 sparse runs the real heads (no concat, no "
                "padded Q or output)", (_src(_FA, "245-258", "flash_attn_varlen_func(fa_version=3)",
                                            "FlashAttnMLASparseImpl._forward_mqa_kernel"),))
_V33_COMMON = (_V33_PAD, _V33_WS, _V33_WS_FP8, _V33_PADCALL, _V33_DECODE, _V33_BACKENDS, _V33_ROUTE, _V33_INDEXER,
               _V33_CG, _V33_KV, _V33_FA3)

# ---------------------------------------------------------------------------------------------- vLLM 0.24.0 / 0.13.0
_V24_FACTS = (
    Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "\"Prefill BF16 kernel requires 64 on Hopper, 128 on "
         "Blackwell\"", (_src(_FM, "578-580", "self.prefill_padding = 128 if "
                              "current_platform.is_device_capability_family(100) else 64", _IMPL),)),
    Fact("workspace.bf16", "(max_num_batched_tokens, num_heads, 576) bf16, unpadded, from the workspace manager",
         "a Q buffer of the real heads; concat_mla_q into it", (
             _src(_FM, "585", "q_concat_shape = (max_tokens, num_heads, head_size)", _IMPL),
             _src(_FM, "871", "ops.concat_mla_q(ql_nope, q_pe, q)", "FlashMLASparseImpl.forward_mqa"))),
    Fact("pad_call", "new_empty", "the bf16 kernel pads per call with q.new_empty((T, prefill_padding, 576)) + copy",
         (_src(_FM, "841", "q_padded = q.new_empty((q.shape[0], self.prefill_padding, q.shape[2]))",
               "FlashMLASparseImpl._bf16_flash_mla_kernel"),)),
    Fact("decode_threshold", {"FLASHMLA_SPARSE": {"sm90": ((), 1), "sm100": ((), 1)}},
         "only single-token requests are decodes", (
             _src(_FM, "252", "self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)", _BLD),)),
    Fact("backend_priority", {"sm90": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)},
                              "sm100": {"fp8": ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                        "bf16<=16": ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                        "bf16>16": ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE")}},
         "sm90: FLASHMLA_SPARSE is the only sparse backend (no FA3 sparse in this release); sm100 bf16 <= 16 heads "
         "FlashInfer first", (
             _src(_CUDA, "136-142", "return " + _list("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA",
                                                      "FLASHMLA_SPARSE"), "_get_backend_priorities"),
             _src(_CUDA, "108-111", "sparse_backends = " + _list("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                  "_get_backend_priorities"))),
    Fact("prefill_route", {"deepseek": "sparse-mqa", "glm": "sparse-mqa"},
         "GlmMoeDsaForCausalLM maps to deepseek_v2; sparse MLA impls send every token down forward_mqa (no dense "
         "prefill)", (
             _src(_REG, "122", "{'GlmMoeDsaForCausalLM': ('deepseek_v2', 'GlmMoeDsaForCausalLM')}",
                  "_TEXT_GENERATION_MODELS"),
             _src("vllm/model_executor/layers/attention/mla_attention.py", "697",
                  "is_sparse_impl = isinstance(self.impl, SparseMLAAttentionImpl)"),
             _src("vllm/model_executor/layers/attention/mla_attention.py", "700", "num_mqa_tokens = q.size(0)"))),
    Fact("cuda_graph", _CG_UNIFORM, "FlashMLA sparse declares UNIFORM_BATCH", (
        _src(_FM, "232", "_cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH",
             _BLD),)),
    Fact("indexer_skip", "never", "every step runs the indexer (no dense route to skip it for)", ()),
)
_V13_FACTS = (
    Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "self.padding: 128 on Blackwell, else 64", (
        _src(_FM, "722", "self.padding = 128 if current_platform.is_device_capability_family(100) else 64", _IMPL),)),
    Fact("workspace.bf16", "none: q = torch.cat([ql_nope, q_pe], dim=-1) per call (a fresh [T, H, 576] tensor)",
         "no Q buffer: torch.cat builds Q each call", (
             _src(_FM, "995", "q = torch.cat([ql_nope, q_pe], dim=-1)", "FlashMLASparseImpl.forward"),)),
    Fact("pad_call", "new_empty", "pads per call with q.new_empty((T, padding, 576)) + copy", (
        _src(_FM, "936", "q_padded = q.new_empty((q.shape[0], self.padding, q.shape[2]))",
             "FlashMLASparseImpl._bf16_flash_mla_kernel"),)),
    Fact("decode_threshold", {"FLASHMLA_SPARSE": {"sm90": ((), 1), "sm100": ((), 1)}},
         "only single-token requests are decodes", (
             _src(_FM, "390", "self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)", _BLD),)),
    Fact("backend_priority", {"sm90": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)},
                              "sm100": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)}},
         "FLASHMLA_SPARSE is the only sparse MLA backend", (
             _src(_CUDA, "64-70", "return " + _list("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA",
                                                    "FLASHMLA_SPARSE"), "_get_backend_priorities"),)),
    Fact("prefill_route", {"deepseek": "sparse-mqa"}, "DeepSeek-V3.2 runs deepseek_v2's DeepseekV3ForCausalLM; "
         "FlashMLASparseImpl.forward sends every token through the sparse kernel (GLM-5 not registered)", (
             _src(_REG, "92", "{'DeepseekV32ForCausalLM': ('deepseek_v2', 'DeepseekV3ForCausalLM')}",
                  "_TEXT_GENERATION_MODELS"),
             _src(_FM, "1009", "attn_out = self._forward_bf16_kv(q, kv_cache, topk_indices, attn_metadata)",
                  "FlashMLASparseImpl.forward"))),
    Fact("cuda_graph", _CG_UNIFORM, "FlashMLA sparse declares UNIFORM_BATCH", (
        _src(_FM, "371", "_cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH",
             _BLD),)),
    Fact("indexer_skip", "never", "every step runs the indexer", ()),
)

# ---------------------------------------------------------------------------------------------- SGLang 0.5.23
_SD = "sglang/srt/layers/attention/dsa_backend.py"
_SG_FACTS = (
    Fact("backend_priority", {"sm90": {"bf16": ("FLASHMLA_SPARSE",)}, "sm100": {"bf16": ("FLASHMLA_SPARSE",)}},
         "bf16 KV: dsa_prefill_backend flashmla_sparse, dsa_decode_backend fa3 on sm90 (trtllm on sm100); the KV "
         "dtype defaults to bf16 on sm90, fp8_e4m3 on sm100", (
             _src("sglang/srt/arg_groups/overrides.py", "724", "declared['dsa_prefill_backend'] = 'flashmla_sparse'"),
             _src("sglang/srt/arg_groups/overrides.py", "726",
                  "declared['dsa_decode_backend'] = 'trtllm' if major >= 10 else 'fa3'"),
             _src("sglang/srt/arg_groups/overrides.py", "533-535",
                  "kv_cache_dtype = 'fp8_e4m3' if major >= 10 and not has_attention_sinks else 'bfloat16'"))),
    Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "_forward_flashmla_sparse pads with new_zeros to 64 (sm90) "
         "or 128 (sm100) per call", (
             _src(_SD, "2824", "required_padding = 128 if self.device_sm_major >= 10 else 64",
                  "_forward_flashmla_sparse"),
             _src(_SD, "2835", "q_padded = q_all.new_zeros((num_tokens, required_padding, head_dim))",
                  "_forward_flashmla_sparse"))),
    Fact("pad_call", "new_zeros", "a zeroed pad per call", (
        _src(_SD, "2835", "q_padded = q_all.new_zeros((num_tokens, required_padding, head_dim))",
             "_forward_flashmla_sparse"),)),
    Fact("prefill_route", {"deepseek": "sparse-mqa-in-graph;dense-if-max_kv_len<=2048",
                           "glm": "sparse-mqa-in-graph;dense-if-max_kv_len<=2048"},
         "dense MHA (MHA_ONE_SHOT) when max_kv_len <= SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD (2048), never "
         "inside a prefill CUDA graph (use_mha = False there)", (
             _src(_SD, "4050", "is_in_tc_piecewise_cuda_graph() or is_in_breakable_cuda_graph()",
                  "set_dsa_prefill_impl"),
             _src(_SD, "4071-4072", "max_kv_len <= envs.SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD.get()",
                  "set_dsa_prefill_impl"),
             _src("sglang/srt/environ.py", "1983", "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = EnvInt(2048)"))),
    Fact("cuda_graph", {"prefill_graph_max_tokens": 8192},
         "breakable prefill CUDA graphs are the CUDA default, captured up to min(8192, chunked_prefill_size) tokens "
         "for MLA models; chunked_prefill_size 8192 on H200 (H20/H200 memory class)", (
             _src("sglang/srt/model_executor/cuda_graph_config.py", "123",
                  "return Backend.BREAKABLE if is_cuda() else Backend.DISABLED", "default_prefill_backend"),
             _src("sglang/srt/arg_groups/memory_hook.py", "238",
                  "prefill_cuda_graph_config.max_bs = min(8192, cfg.chunked_prefill_size)"),
             _src("sglang/srt/arg_groups/memory_hook.py", "149-153", "declare_resolution(server_args, "
                  "'_handle_gpu_memory_settings', chunked_prefill_size=8192)"))),
    Fact("indexer_skip", "outside prefill graphs, when the dense route is taken", "the indexer runs whenever the "
         "sparse route runs (inside every prefill graph)", ()),
    Fact("triton_prefill", "opt-in triton_sparse_mla prefill: one program per query token, heads padded to a "
         "16-row tile (block_h = max(16, next_power_of_2(H)))", "SGLang's Triton sparse prefill pads to 16 rows", (
             _src("sglang/kernels/ops/attention/dsa/triton_sparse_mla_prefill.py", "482",
                  "block_h = max(16, triton.next_power_of_2(h))"),)),
)


# ---------------------------------------------------------------------------------------------- presets
def _p(name, ev, summary, rule, forced, facts):
    return EnginePreset(name, ev, summary, rule, forced, tuple(facts))


_FORCED = Fact("forced_backend", "FLASHMLA_SPARSE", "--attention-backend FLASHMLA_SPARSE, as PR #53878's server",
               ())
ENGINE_PRESETS = {p.name: p for p in (
    _p("vllm@pr53878-before", V_PRE, "private unpadded Q buffer + new_empty pad per call (range: pad zeros / stale)",
       "vllm-flashmla", "FLASHMLA_SPARSE",
       (_PR_ERA_PADDING, _PR_ERA_ROUTE, _PR_ERA_DECODE, _PR_ERA_BACKENDS, _PR_ERA_CG, _PR_ERA_INDEXER, _FORCED,
        Fact("pad_call", "new_empty", "q.new_empty((T, prefill_padding, 576)) + slice copy per call",
             (_pr(_PRE_SRC, "-", "pass"),)))),
    _p("vllm@pr53878", V_PR, "pre-padded private Q-concat workspace (padded heads never written: zeros)",
       "vllm-flashmla", "FLASHMLA_SPARSE",
       (_PR_ERA_PADDING, _PR_ERA_ROUTE, _PR_ERA_DECODE, _PR_ERA_BACKENDS, _PR_ERA_CG, _PR_ERA_INDEXER, _FORCED,
        Fact("pad_call", "workspace", "concat_mla_q into the padded workspace (PR #53878)",
             (_pr(_FM + " (PR #53878)", "-", "pass"),)))),
    _p("vllm@56902", V_56902, "padded view of the shared workspace per call (padded heads hold its scratch)",
       "vllm-flashmla", "FLASHMLA_SPARSE",
       (_PR_ERA_PADDING, _PR_ERA_ROUTE, _PR_ERA_DECODE, _PR_ERA_BACKENDS, _PR_ERA_CG, _PR_ERA_INDEXER, _FORCED,
        Fact("pad_call", "workspace", "per-call view of the shared workspace (PR #56902)",
             (_pr(_FM + " (PR #56902)", "-", "pass"),)))),
    _p("vllm@0.13.0", V_013, "torch.cat Q + new_empty pad per call; every token sparse; DeepSeek-V3.2 only",
       "vllm-0.13.0", None, _V13_FACTS),
    _p("vllm@0.24.0", V_024, "private unpadded Q buffer + new_empty pad per call; every token sparse",
       "vllm-0.24.0", None, _V24_FACTS),
    _p("vllm@0.33.0", V_033, "defaults: sm90 bf16 FA3 sparse (real heads); short prefills dense MHA",
       "vllm-0.33.0", None, _V33_COMMON),
    _p("vllm@0.33.0-flashmla", V_033, "FLASHMLA_SPARSE forced: per-call view of the shared workspace padded to 64; "
       "short prefills still dense MHA", "vllm-0.33.0-flashmla",
       "FLASHMLA_SPARSE", _V33_COMMON + (_FORCED,)),
    _p("sglang@0.5.23", S_0523, "H200 defaults: prefill flashmla_sparse (new_zeros pad) inside breakable prefill "
       "graphs, decode fa3", "sglang-0.5.23", None, _SG_FACTS),
)}

#: What the lab's first (PR-era) presets relied on, written as the code that would say it in a release wheel: the
#: wheel check reports which of these still hold in each release (``lab-claim`` rows; a ``fails`` there = the lab's
#: old fact no longer holds). Keyed by engine.
LAB_CLAIMS = {
    "vllm": (
        Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "the lab padded to 128 heads on Blackwell (b200 rows)",
             (_src(_FM, "-", "self.prefill_padding = 128 if current_platform.is_device_capability_family(100) "
                   "else 64", _IMPL),)),
        Fact("workspace.bf16", "private unpadded (max_num_batched_tokens, num_heads, 576) Q buffer before the PR",
             "the pre-PR Q buffer held the real heads", (
                 _src(_FM, "-", "q_concat_shape = (max_tokens, num_heads, head_size)", _IMPL),)),
        Fact("decode_threshold", 1, "FLASHMLA_SPARSE: only single-token requests are decodes", (
            _src(_FM, "-", "self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)", _BLD + ".__init__"),)),
        Fact("decode_threshold.fa3", 1024, "FLASH_ATTN_MLA_SPARSE: requests of <= 1024 query tokens are decodes", (
            _src(_FA, "-", "self._init_reorder_batch_threshold(1024, supports_spec_as_decode=True)",
                 "FlashAttnMLASparseMetadataBuilder.__init__"),)),
        Fact("prefill_route.glm", "sparse-mqa", "GLM-5/5.2 prefill MQA-only: GlmMoeDsaForCausalLM on deepseek_v2, "
             "sparse impls send every token down forward_mqa", (
                 _src(_REG, "-", "{'GlmMoeDsaForCausalLM': ('deepseek_v2', 'GlmMoeDsaForCausalLM')}",
                      "_TEXT_GENERATION_MODELS"),
                 _src("vllm/model_executor/layers/attention/mla_attention.py", "-",
                      "is_sparse_impl = isinstance(self.impl, SparseMLAAttentionImpl)"))),
    ),
    "sglang": (
        Fact("prefill_route", "mha-dense <= 2048", "SGLang's default H200 prefill is dense MHA for prompts of <= 2048 "
             "tokens: no prefill CUDA graph by default", (
                 _src("sglang/srt/model_executor/cuda_graph_config.py", "-", "return Backend.DISABLED",
                      "default_prefill_backend"),)),
        Fact("prefill_route.threshold", 2048, "dense MHA when the batch's longest KV is <= 2048", (
            _src("sglang/srt/environ.py", "-", "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = EnvInt(2048)"),)),
    ),
}

def engine_names() -> list[str]:
    """Every engine preset name."""
    return list(ENGINE_PRESETS)


def resolve_engine(name: str) -> str:
    """``name`` if it is an engine preset (the lab's first names are read by
    :func:`mla_lab.placement.resolve_engine`, which knows them).

    Raises:
        ValueError: one line naming ``--engine``, the value and the allowed values.
    """
    if isinstance(name, str) and name in ENGINE_PRESETS:
        return name
    raise ValueError(f"--engine={name!r} is not valid; allowed: {engine_names()}")


def engine_preset(name: str) -> EnginePreset:
    """The :class:`EnginePreset` of a name (:func:`resolve_engine`). Raises ValueError as that does."""
    return ENGINE_PRESETS[resolve_engine(name)]


def engine_version(engine: str, version: str) -> EngineVersion:
    """The :class:`EngineVersion` ``engine@version``.

    Raises:
        ValueError: a version the lab does not describe (names those it does).
    """
    key = f"{engine}@{version}"
    if key not in ENGINE_VERSIONS:
        raise ValueError(f"engine version={key!r} is not described by the lab; allowed: {list(ENGINE_VERSIONS)}")
    return ENGINE_VERSIONS[key]


def fact(preset: str, key: str) -> Fact:
    """The :class:`Fact` ``key`` of ``preset``. Raises ValueError naming the preset's keys."""
    return engine_preset(preset).fact(key)


def version_facts(ev: EngineVersion):
    """``(preset name, Fact, Source)`` for every checkable source of every preset of ``ev``, each
    (path, scope, code) once; then the lab's PR-era claims (:data:`LAB_CLAIMS`) for its engine, as preset
    ``lab (PR-era)``."""
    seen = set()
    for f in LAB_CLAIMS.get(ev.engine, ()) if ev.wheel else ():
        for s in f.sources:
            yield "lab (PR-era)", f, s
    for p in ENGINE_PRESETS.values():
        if p.engine_version != ev:
            continue
        for f in p.facts:
            for s in f.sources:
                k = (f.key, s.path, s.scope, s.code)
                if s.checkable and k not in seen:
                    seen.add(k)
                    yield p.name, f, s


def _sm_key(sm) -> str:
    s = str(sm).lower().replace("sm", "")
    if s in ("90", "9"):
        return "sm90"
    if s in ("100", "10"):
        return "sm100"
    raise ValueError(f"sm={sm!r} is not valid; allowed: ['sm90', 'sm100']")


def _kv_key(kv_cache_dtype: str) -> str:
    k = str(kv_cache_dtype).lower()
    if k in ("bf16", "bfloat16", "auto"):
        return "bf16"
    if k.startswith("fp8"):
        return "fp8"
    raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not valid; allowed: bf16 (auto, bfloat16), fp8 "
                     "(fp8_ds_mla, fp8_e4m3)")


def sparse_backend(preset: str, sm, kv_cache_dtype: str, num_heads: int) -> str:
    """The sparse-MLA backend ``preset`` runs on ``sm`` with that KV dtype and ``num_heads`` heads per rank: the
    forced backend, else the first of the version's priority list (fact ``backend_priority``) that runs there
    (:data:`BACKENDS`). Other constraints (FA4 availability, head size 512) are not modelled.

    Raises:
        ValueError: bad sm / kv_cache_dtype / preset; no backend of the list runs there.
    """
    p = engine_preset(preset)
    sm_k, kv = _sm_key(sm), _kv_key(kv_cache_dtype)
    major = 9 if sm_k == "sm90" else 10
    if p.forced_backend:
        gpus, kvs = BACKENDS[p.forced_backend]
        if major in gpus and kv in kvs:
            return p.forced_backend
        raise ValueError(f"--engine={p.name!r} forces {p.forced_backend}, which does not run on {sm_k} with {kv} KV")
    prio = p.fact("backend_priority").value.get(sm_k, {})
    lst = prio.get(kv) or prio.get(f"{kv}<=16" if num_heads <= 16 else f"{kv}>16") or ()
    for b in lst:
        gpus, kvs = BACKENDS[b]
        if major in gpus and kv in kvs:
            return b
    raise ValueError(f"--engine={p.name!r} has no sparse backend on {sm_k} with {kv} KV; allowed: "
                     f"{[k for k, v in prio.items()]}")


def padding_for(preset: str, backend: str, sm, kv_cache_dtype: str = "bf16") -> int:
    """Heads the backend pads a bf16 sparse prefill to (``prefill_padding``), 0 when it takes the real heads
    (:data:`UNPADDED_BACKENDS`; FLASHMLA_SPARSE with an fp8 KV cache keeps num_heads for the Q-concat buffer).

    Raises:
        ValueError: bad sm / preset.
    """
    p = engine_preset(preset)
    if backend in UNPADDED_BACKENDS or _kv_key(kv_cache_dtype) == "fp8":
        return 0
    return int(p.fact("prefill_padding").value[_sm_key(sm)])


def decode_threshold(preset: str, backend: str, sm, num_heads: int) -> tuple[int, bool]:
    """``(n, uniform)``: requests of at most ``n`` query tokens are handled as decodes by ``backend`` under
    ``preset`` (``{heads: n}.get(num_heads, default)``); ``uniform`` True when decodes must share one query length
    (vLLM ``require_uniform_decodes``, FLASHMLA_SPARSE in 0.33.0).

    Raises:
        ValueError: a backend the preset's facts give no threshold for.
    """
    p = engine_preset(preset)
    table = p.fact("decode_threshold").value if p.has("decode_threshold") else {}
    by_sm = table.get(backend, {})
    key = _sm_key(sm)
    if key not in by_sm:
        raise ValueError(f"--engine={p.name!r} gives no decode threshold for {backend} on {key}; allowed: "
                         f"{[(b, list(v)) for b, v in table.items()]}")
    pairs, default = by_sm[key]
    uniform = backend == "FLASHMLA_SPARSE" and p.engine_version == V_033
    return dict(pairs).get(num_heads, default), uniform


def fp8_reserved_bytes(num_heads: int, max_num_batched_tokens: int, max_model_len: int, head_size: int = 576,
                       kv_lora_rank: int = 512) -> dict:
    """Bytes vLLM 0.33.0's FLASHMLA_SPARSE ``__init__`` asks the shared workspace for with an fp8 (``fp8_ds_mla``)
    KV cache (fact ``workspace.fp8``: ``flashmla_sparse.py:776,810,822-829``; factor ``vllm/config/vllm.py:1872-1874``),
    all bf16 (2 bytes), no PCP/DCP: the Q-concat ``(T, H, head_size)``, the prefill gather ``(factor x
    max_model_len, head_size)`` (factor 5 when max_model_len <= 256 x 1024, else 2), a padded Q
    ``(T, round_up(H, 64), head_size)``, a padded output ``(T, round_up(H, 64), kv_lora_rank)`` and an output
    ``(T, H, kv_lora_rank)``. They are taken together (``get_simultaneous``), so the shared workspace grows to their
    sum unless another user (the fused MoE) already asks for more. Returns ``{name: bytes}`` and ``total``.

    Raises:
        ValueError: a size not a positive int.
    """
    for name, v in (("num_heads", num_heads), ("max_num_batched_tokens", max_num_batched_tokens),
                    ("max_model_len", max_model_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r} must be a positive int")
    T, H, Hp = max_num_batched_tokens, num_heads, -(-num_heads // 64) * 64
    factor = 5 if max_model_len <= 256 * 1024 else 2
    out = {"q_concat": T * H * head_size * 2, "prefill_gather": factor * max_model_len * head_size * 2,
           "padded_q": T * Hp * head_size * 2, "padded_out": T * Hp * kv_lora_rank * 2,
           "out": T * H * kv_lora_rank * 2}
    out["total"] = sum(out.values())
    return out
