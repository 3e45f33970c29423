"""Engine version ``vllm@0.24.0``: release 0.24.0 (wheel built 2026-06-29): the pre-PR placement (private
unpadded buffer, ``concat_mla_q``, ``new_empty`` pad); sparse impls send every token down ``forward_mqa``."""

from ..record import EnginePreset, EngineVersion, Fact, src, version_rule
from ._common import BLD, CG_UNIFORM, CUDA, FM, IMPL, REG, backend_list

FACTS = (
    Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "\"Prefill BF16 kernel requires 64 on Hopper, 128 on "
         "Blackwell\"", (src(FM, "578-580", "self.prefill_padding = 128 if "
                              "current_platform.is_device_capability_family(100) else 64", IMPL),)),
    Fact("workspace.bf16", "(max_num_batched_tokens, num_heads, 576) bf16, unpadded, from the workspace manager",
         "a Q buffer of the real heads; concat_mla_q into it", (
             src(FM, "585", "q_concat_shape = (max_tokens, num_heads, head_size)", IMPL),
             src(FM, "871", "ops.concat_mla_q(ql_nope, q_pe, q)", "FlashMLASparseImpl.forward_mqa"))),
    Fact("pad_call", "new_empty", "the bf16 kernel pads per call with q.new_empty((T, prefill_padding, 576)) + copy",
         (src(FM, "841", "q_padded = q.new_empty((q.shape[0], self.prefill_padding, q.shape[2]))",
               "FlashMLASparseImpl._bf16_flash_mla_kernel"),)),
    Fact("decode_threshold", {"FLASHMLA_SPARSE": {"sm90": ((), 1), "sm100": ((), 1)}},
         "only single-token requests are decodes", (
             src(FM, "252", "self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)", BLD),)),
    Fact("backend_priority", {"sm90": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)},
                              "sm100": {"fp8": ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                        "bf16<=16": ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                        "bf16>16": ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE")}},
         "sm90: FLASHMLA_SPARSE is the only sparse backend (no FA3 sparse in this release); sm100 bf16 <= 16 heads "
         "FlashInfer first", (
             src(CUDA, "136-142", "return " + backend_list("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA",
                                                      "FLASHMLA_SPARSE"), "_get_backend_priorities"),
             src(CUDA, "108-111", "sparse_backends = " + backend_list("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                  "_get_backend_priorities"))),
    Fact("prefill_route", {"deepseek": "sparse-mqa", "glm": "sparse-mqa"},
         "GlmMoeDsaForCausalLM maps to deepseek_v2; sparse MLA impls send every token down forward_mqa (no dense "
         "prefill)", (
             src(REG, "122", "{'GlmMoeDsaForCausalLM': ('deepseek_v2', 'GlmMoeDsaForCausalLM')}",
                  "_TEXT_GENERATION_MODELS"),
             src("vllm/model_executor/layers/attention/mla_attention.py", "697",
                  "is_sparse_impl = isinstance(self.impl, SparseMLAAttentionImpl)"),
             src("vllm/model_executor/layers/attention/mla_attention.py", "700", "num_mqa_tokens = q.size(0)"))),
    Fact("cuda_graph", CG_UNIFORM, "FlashMLA sparse declares UNIFORM_BATCH", (
        src(FM, "232", "_cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH",
             BLD),)),
    Fact("indexer_skip", "never", "every step runs the indexer (no dense route to skip it for)", ()),
)

PRESET = EnginePreset(
    "vllm@0.24.0", EngineVersion("vllm", "0.24.0", "2026-06-29", "vllm-0.24.0"),
    "private unpadded Q buffer + new_empty pad per call; every token sparse",
    version_rule("vllm@0.24.0", FACTS, "sparse-mqa", 0, (), backend="FLASHMLA_SPARSE",
                 why="vLLM 0.24.0: sparse MLA impls send every token down forward_mqa"),
    None, FACTS, members=("per_call_empty:zeros", "per_call_empty:stale"), order=4)
