"""Engine version ``vllm@0.13.0``: release 0.13.0 (wheel built 2025-12-19): ``torch.cat`` Q + ``new_empty`` pad
(priced as ``per_call_empty``: a fresh tensor, no buffer); every token down FlashMLA sparse; GLM-5 not registered."""

from ..record import EnginePreset, EngineVersion, Fact, src, version_rule
from ._common import BLD, CG_UNIFORM, CUDA, FM, IMPL, REG, backend_list

FACTS = (
    Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "self.padding: 128 on Blackwell, else 64", (
        src(FM, "722", "self.padding = 128 if current_platform.is_device_capability_family(100) else 64", IMPL),)),
    Fact("workspace.bf16", "none: q = torch.cat([ql_nope, q_pe], dim=-1) per call (a fresh [T, H, 576] tensor)",
         "no Q buffer: torch.cat builds Q each call", (
             src(FM, "995", "q = torch.cat([ql_nope, q_pe], dim=-1)", "FlashMLASparseImpl.forward"),)),
    Fact("pad_call", "new_empty", "pads per call with q.new_empty((T, padding, 576)) + copy", (
        src(FM, "936", "q_padded = q.new_empty((q.shape[0], self.padding, q.shape[2]))",
             "FlashMLASparseImpl._bf16_flash_mla_kernel"),)),
    Fact("decode_threshold", {"FLASHMLA_SPARSE": {"sm90": ((), 1), "sm100": ((), 1)}},
         "only single-token requests are decodes", (
             src(FM, "390", "self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)", BLD),)),
    Fact("backend_priority", {"sm90": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)},
                              "sm100": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)}},
         "FLASHMLA_SPARSE is the only sparse MLA backend", (
             src(CUDA, "64-70", "return " + backend_list("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA",
                                                    "FLASHMLA_SPARSE"), "_get_backend_priorities"),)),
    Fact("prefill_route", {"deepseek": "sparse-mqa"}, "DeepSeek-V3.2 runs deepseek_v2's DeepseekV3ForCausalLM; "
         "FlashMLASparseImpl.forward sends every token through the sparse kernel (GLM-5 not registered)", (
             src(REG, "92", "{'DeepseekV32ForCausalLM': ('deepseek_v2', 'DeepseekV3ForCausalLM')}",
                  "_TEXT_GENERATION_MODELS"),
             src(FM, "1009", "attn_out = self._forward_bf16_kv(q, kv_cache, topk_indices, attn_metadata)",
                  "FlashMLASparseImpl.forward"))),
    Fact("cuda_graph", CG_UNIFORM, "FlashMLA sparse declares UNIFORM_BATCH", (
        src(FM, "371", "_cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH",
             BLD),)),
    Fact("indexer_skip", "never", "every step runs the indexer", ()),
)

PRESET = EnginePreset(
    "vllm@0.13.0", EngineVersion("vllm", "0.13.0", "2025-12-19", "vllm-0.13.0", ("deepseek",),
                                 "GlmMoeDsaForCausalLM is not in its model registry"),
    "torch.cat Q + new_empty pad per call; every token sparse; DeepSeek-V3.2 only",
    version_rule("vllm@0.13.0", FACTS, "sparse-mqa", 0, (), backend="FLASHMLA_SPARSE",
                 why="vLLM 0.13.0: FlashMLASparseImpl.forward sends every token to the sparse kernel"),
    None, FACTS, members=("per_call_empty:zeros", "per_call_empty:stale"), order=3)
