"""Facts, rule and first-name table shared by the PR-era vLLM builds (mid-2026 main, PR #53878, PR #56902: no
release wheel; cited, not checked), and what the lab's PR-era presets relied on (:data:`LAB_CLAIMS`, checked in
every release wheel as ``lab (PR-era)`` rows)."""

from __future__ import annotations

from ..record import EnginePreset, EngineRule, EngineVersion, Fact, pr_src, src
from ._common import BLD, CG_UNIFORM, CUDA, FA, FM, FORCED, IMPL, REG

PRE_SRC = "vllm/v1/attention/backends/mla/flashmla_sparse.py (PR #53878's merge-base)"
_PR_ERA_PADDING = Fact("prefill_padding", {"sm90": 64, "sm100": 128},
                       "the bf16 sparse prefill pads heads to 64 on Hopper, 128 on Blackwell (capability family 100)",
                       (pr_src(PRE_SRC, "self.prefill_padding = 128 if "
                            "current_platform.is_device_capability_family(100) else 64", IMPL),))
_PR_ERA_ROUTE = Fact("prefill_route", {"deepseek": "dense-if-every-prefill<=topk", "glm": "sparse-mqa"},
                     "DeepSeek-V3.2 prefills go dense MHA when every prefill has seq_len <= topk (vLLM #47327); "
                     "GLM-5/5.2 run through the MQA-only DeepseekV32Attention wrapper (vLLM #52512)",
                     (pr_src("vllm/models/deepseek_v32/attention.py (PR #52512)"),))
_PR_ERA_DECODE = Fact("decode_threshold", {"FLASHMLA_SPARSE": {"sm90": ((), 1), "sm100": ((), 1)},
                                           "FLASH_ATTN_MLA_SPARSE": {"sm90": ((), 1024)}},
                      "query tokens per request still handled as a decode: 1 for FLASHMLA_SPARSE (vLLM's default), "
                      "1024 for FLASH_ATTN_MLA_SPARSE (flashattn_mla_sparse.py at 0299fca7)",
                      (pr_src(FA + " (0299fca7)", "self._init_reorder_batch_threshold(1024, "
                           "supports_spec_as_decode=True)"),))
_PR_ERA_BACKENDS = Fact("backend_priority", {"sm90": {"bf16": ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"),
                                                      "fp8": ("FLASHMLA_SPARSE",)},
                                             "sm100": {"bf16": ("FLASHMLA_SPARSE",), "fp8": ("FLASHMLA_SPARSE",)}},
                        "sm90 sparse priority FA3 sparse before FLASHMLA_SPARSE (vLLM issue #56564, 0.28.x)",
                        (pr_src(CUDA + " (0.28.x, vLLM issue #56564)"),))
_PR_ERA_CG = Fact("cuda_graph", CG_UNIFORM, "FlashMLA sparse declares AttentionCGSupport.UNIFORM_BATCH",
                  (pr_src(PRE_SRC),))
_PR_ERA_INDEXER = Fact("indexer_skip", "never", "the indexer runs on every DSA layer's step (GLM-5.2: the layers "
                       "carrying one, index_topk_freq 4)", (pr_src(PRE_SRC),))

#: Why GLM-5/5.2 take the backend route on vLLM's PR-era rules.
GLM_MQA_ONLY = (("glm", "MQA-only attention wrapper (vLLM #52512)"),)
#: vLLM's FLASHMLA_SPARSE backend on the PR-era routes (DeepSeek-V3.2 dense MHA when every prefill has
#: seq_len <= topk, #47327; GLM-5/5.2 MQA-only, #52512); the default rule of the vLLM placements.
VLLM_SRC = ("vLLM PR #47327 (dense MHA when every prefill has seq_len <= topk; DeepSeek-V3.2 on the registered "
            "MLA layer), PR #52512 (merged 2026-08-16: the NVIDIA DeepseekV32Attention wrapper GLM-5/5.2 run "
            "through is MQA-only)")
RULE = EngineRule(
    "vllm-flashmla", "vllm", "sparse-mqa", "sparse-mqa", "topk", ("deepseek",), True, VLLM_SRC + "; "
    "--attention-backend FLASHMLA_SPARSE: flashmla_sparse.py, bf16 KV cache decode also padded (mla_attention.py "
    "sends all tokens down the MQA path)", family_reasons=GLM_MQA_ONLY)
FACTS = (_PR_ERA_PADDING, _PR_ERA_ROUTE, _PR_ERA_DECODE, _PR_ERA_BACKENDS, _PR_ERA_CG, _PR_ERA_INDEXER, FORCED)


def preset(tag: str, date: str, note: str, summary: str, pad_call: tuple, members: tuple, order: int,
           first_name: str) -> EnginePreset:
    """A PR-era vLLM build (no release wheel) on :data:`RULE` and :data:`FACTS`, plus its fact ``pad_call``
    ``(value, text, cited file)``."""
    pad = Fact("pad_call", pad_call[0], pad_call[1], (pr_src(pad_call[2]),))
    return EnginePreset(f"vllm@{tag}", EngineVersion("vllm", tag, date, None, ("deepseek", "glm"), note), summary,
                        RULE, "FLASHMLA_SPARSE", FACTS + (pad,), members=members, order=order,
                        first_names=(first_name,))


#: What the lab's first (PR-era) presets relied on, as the code that would say it in a release wheel (keyed by
#: engine): the wheel check reports which still hold (``lab-claim`` rows; ``fails`` = the old fact no longer holds).
LAB_CLAIMS = {
    "vllm": (
        Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "the lab padded to 128 heads on Blackwell (b200 rows)",
             (src(FM, "-", "self.prefill_padding = 128 if current_platform.is_device_capability_family(100) "
                   "else 64", IMPL),)),
        Fact("workspace.bf16", "private unpadded (max_num_batched_tokens, num_heads, 576) Q buffer before the PR",
             "the pre-PR Q buffer held the real heads", (
                 src(FM, "-", "q_concat_shape = (max_tokens, num_heads, head_size)", IMPL),)),
        Fact("decode_threshold", 1, "FLASHMLA_SPARSE: only single-token requests are decodes", (
            src(FM, "-", "self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)", BLD + ".__init__"),)),
        Fact("decode_threshold.fa3", 1024, "FLASH_ATTN_MLA_SPARSE: requests of <= 1024 query tokens are decodes", (
            src(FA, "-", "self._init_reorder_batch_threshold(1024, supports_spec_as_decode=True)",
                 "FlashAttnMLASparseMetadataBuilder.__init__"),)),
        Fact("prefill_route.glm", "sparse-mqa", "GLM-5/5.2 prefill MQA-only: GlmMoeDsaForCausalLM on deepseek_v2, "
             "sparse impls send every token down forward_mqa", (
                 src(REG, "-", "{'GlmMoeDsaForCausalLM': ('deepseek_v2', 'GlmMoeDsaForCausalLM')}",
                      "_TEXT_GENERATION_MODELS"),
                 src("vllm/model_executor/layers/attention/mla_attention.py", "-",
                      "is_sparse_impl = isinstance(self.impl, SparseMLAAttentionImpl)"))),
    ),
    "sglang": (
        Fact("prefill_route", "mha-dense <= 2048", "SGLang's default H200 prefill is dense MHA for prompts of <= 2048 "
             "tokens: no prefill CUDA graph by default", (
                 src("sglang/srt/model_executor/cuda_graph_config.py", "-", "return Backend.DISABLED",
                      "default_prefill_backend"),)),
        Fact("prefill_route.threshold", 2048, "dense MHA when the batch's longest KV is <= 2048", (
            src("sglang/srt/environ.py", "-", "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = EnvInt(2048)"),)),
    ),
}
