"""Engine version ``vllm@0.33.0``: release 0.33.0 (wheel built 2026-11-01) with its defaults: sm90 bf16 KV -> FA3
sparse (real heads); GLM-5/5.2 and DeepSeek-V3.2 prefill rows dense MHA when every prefill has seq_len <= index_topk.
``COMMON`` (its facts) is shared with ``vllm@0.33.0-flashmla``."""

from ..record import EnginePreset, EngineVersion, Fact, src, version_rule
from ._common import BLD, CUDA, FA, FM, IMPL, REG, backend_list

RELEASE = EngineVersion("vllm", "0.33.0", "2026-11-01", "vllm-0.33.0")
_V33_PAD = Fact("prefill_padding", {"sm90": 64, "sm100": 64},
                "\"Prefill BF16 kernel requires 64 heads on Hopper and Blackwell\": prefill_padding 64 on both",
                (src(FM, "754", "self.prefill_padding = 64", IMPL),))
_V33_WS = Fact("workspace.bf16", "(max_num_batched_tokens, round_up(num_heads, 64), 576) bf16, a view of the shared "
               "workspace taken per call at offset 0; concat_mla_q writes the real heads, nothing zeroes the rest",
               "bf16 KV: q_concat_heads = round_up(num_heads, prefill_padding), the Q buffer a per-call view of the "
               "shared workspace (vllm/v1/worker/workspace.py: torch.empty, not zeroed)",
               (src(FM, "771-775", "q_concat_heads = (num_heads + self.prefill_padding - 1) // "
                     "self.prefill_padding * self.prefill_padding", IMPL),
                src(FM, "1420-1422", "q_concat_buffer, *_ = current_workspace_manager().get_simultaneous("
                     "*self.workspace_specs)", "FlashMLASparseImpl.forward_mqa"),
                src(FM, "1431", "ops.concat_mla_q(ql_nope, q_pe, q)", "FlashMLASparseImpl.forward_mqa")))
_V33_WS_FP8 = Fact("workspace.fp8", ("(max_num_batched_tokens, num_heads, 576)",
                                     "(factor * max_model_len, 576)",
                                     "(max_num_batched_tokens, round_up(num_heads, 64), 576)",
                                     "(max_num_batched_tokens, round_up(num_heads, 64), 512)",
                                     "(max_num_batched_tokens, num_heads, 512)"),
                   "fp8 KV: __init__ also reserves (all bf16, from the shared workspace) the prefill gather "
                   "workspace of factor x max_model_len rows (factor 5 when max_model_len <= 256K, else 2), a padded "
                   "Q, a padded output and an unpadded output",
                   (src(FM, "810", "self.prefill_workspace_shape = (shard_rows, self.q_head_size)", IMPL),
                    src(FM, "822-829", "self.workspace_specs.extend(((shape, torch.bfloat16) for shape in "
                         "((max_tokens, padded_prefill_query_heads, self.q_head_size), (max_tokens, "
                         "padded_prefill_query_heads, self.kv_lora_rank), (max_tokens, prefill_query_heads, "
                         "self.kv_lora_rank))))", IMPL),
                    src(FM, "832", "current_workspace_manager().get_simultaneous(*self.workspace_specs)", IMPL),
                    src("vllm/config/vllm.py", "1872-1874", "self.attention_config."
                         "sparse_mla_prefill_workspace_factor = 5 if self.model_config.max_model_len <= 256 * 1024 "
                         "else 2")))
_V33_PADCALL = Fact("pad_call", "new_empty", "without a pre-padded buffer (out=None) _bf16_flash_mla_kernel pads "
                    "with q.new_empty((T, padded_num_heads, 576)) + copy",
                    (src(FM, "1382", "q_padded = q.new_empty((q.shape[0], padded_num_heads, q.shape[2]))",
                          "FlashMLASparseImpl._bf16_flash_mla_kernel"),))
_V33_DECODE = Fact("decode_threshold",
                   {"FLASHMLA_SPARSE": {"sm90": (((16, 128), (32, 128), (64, 256), (128, 256)), 256),
                                        "sm100": (((8, 128), (16, 128), (32, 128), (64, 256), (128, 1024)), 1024)},
                    "FLASH_ATTN_MLA_SPARSE": {"sm90": (((16, 128), (32, 128), (64, 256), (128, 256)), 256)}},
                   "query tokens per request handled as a decode ({heads: n}.get(num_heads, default)): FA3 sparse "
                   "256 at 8 heads, 128 at 16; FlashMLA the same on sm90 with uniform-length decodes only "
                   "(require_uniform_decodes)",
                   (src(FM, "371", "threshold = {16: 128, 32: 128, 64: 256, 128: 256}.get(num_q_heads, 256)",
                         BLD + ".__init__"),
                    src(FM, "367-369", "threshold = {8: 128, 16: 128, 32: 128, 64: 256, 128: 1024}.get("
                         "num_q_heads, 1024)", BLD + ".__init__"),
                    src(FM, "351", "require_uniform_decodes: ClassVar[bool] = True", BLD),
                    src(FA, "142", "threshold = {16: 128, 32: 128, 64: 256, 128: 256}.get(num_q_heads, 256)",
                         "FlashAttnMLASparseMetadataBuilder.__init__"),
                    src("vllm/v1/attention/backends/utils.py", "892",
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
                     (src(CUDA, "138-141", "sparse_tail = " + backend_list("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"),
                           "_get_backend_priorities"),
                      src(CUDA, "101-104", "sparse_backends = " + backend_list(
                          "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                           "_get_backend_priorities"),
                      src(CUDA, "109-113", "sparse_backends = " + backend_list(
                          "FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
                          "_get_backend_priorities"),
                      src(CUDA, "110", "num_heads is not None and num_heads <= 16", "_get_backend_priorities"),
                      src(CUDA, "115-118", "sparse_backends = " + backend_list(
                          "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"),
                           "_get_backend_priorities"),
                      src(FA, "83", "return capability.major == 9", "FlashAttnMLASparseBackend"),
                      src(FA, "98", "kv_cache_dtype not in (None, 'auto', 'float16', 'bfloat16')",
                           "FlashAttnMLASparseBackend.supports_combination")))
_V33_ROUTE = Fact("prefill_route", {"deepseek": "dense-if-every-prefill<=topk", "glm": "dense-if-every-prefill<=topk"},
                  "GlmMoeDsaForCausalLM maps to vllm.models.deepseek_v32, whose MLA attention has a dense-MHA "
                  "prefill (FlashAttention varlen on sm90): prefill rows go dense when every prefill of the step has "
                  "seq_len <= index_topk (HiSparse off, sparse_mla_force_mqa False, the default); decode rows of the "
                  "same step take the sparse backend",
                  (src(REG, "126", "{'GlmMoeDsaForCausalLM': ('vllm.models.deepseek_v32', 'GlmMoeDsaForCausalLM')}",
                        "_TEXT_GENERATION_MODELS"),
                   src("vllm/model_executor/layers/attention/mla_attention.py", "440",
                        "supports_dense_mha_prefill: ClassVar[bool] = True", "MLAAttention"),
                   src("vllm/model_executor/layers/attention/sparse_mla_attention.py", "143",
                        "prefill_max_seq_len <= topk_tokens", "_use_dense_mha_prefill"),
                   src("vllm/model_executor/layers/attention/sparse_mla_attention.py", "278",
                        "topk_tokens = model_config.hf_text_config.index_topk"),
                   src("vllm/config/attention.py", "135", "sparse_mla_force_mqa: bool = False", "AttentionConfig"),
                   src("vllm/platforms/interface.py", "482", "priorities = [MLAPrefillBackendEnum.FLASH_ATTN]",
                        "Platform.get_mla_prefill_backend_cls")))
_V33_INDEXER = Fact("indexer_skip", "pure-prefill steps whose prefills all go dense, outside full CUDA graphs",
                    "the indexer's top-k is skipped only when the step is pure prefill (no decode tokens), its "
                    "prefills take dense MHA and the step is not a full CUDA graph",
                    (src("vllm/models/deepseek_v32/attention.py", "227-233", "enable_short_prefill_scoring_skip = "
                          "not is_mtp_layer and not skip_topk and not self.use_pcp and current_platform.is_cuda() "
                          "and self.supports_dense_mha_prefill", "DeepseekV32Attention.__init__"),
                     src("vllm/model_executor/layers/sparse_attn_indexer.py", "583",
                          "forward_context.cudagraph_runtime_mode != CUDAGraphMode.FULL"),
                     src("vllm/model_executor/layers/sparse_attn_indexer.py", "590",
                          "getattr(mla_metadata, 'num_decode_tokens', -1) == 0")))
_V33_CG = Fact("cuda_graph", "breakable CUDA graphs for DSA models (torch.compile off); sparse backends declare "
               "UNIFORM_BATCH (uniform decode batches as full graphs)",
               "GlmMoeDsaForCausalLM and DeepseekV32ForCausalLM are in DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES",
               (src("vllm/config/vllm.py", "76-107", "frozenset({'GlmMoeDsaForCausalLM', 'DeepseekV32ForCausalLM'})",
                     "DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES"),
                src(FM, "350", "_cudagraph_support: ClassVar[AttentionCGSupport] = "
                     "AttentionCGSupport.UNIFORM_BATCH", BLD),
                src(FA, "128", "_cudagraph_support: ClassVar[AttentionCGSupport] = "
                     "AttentionCGSupport.UNIFORM_BATCH", "FlashAttnMLASparseMetadataBuilder")))
_V33_KV = Fact("default_kv.sm100", "fp8", "GLM (GlmMoeDsaForCausalLM) defaults to an fp8 KV cache on sm100 when the "
               "KV dtype is 'auto'", (src("vllm/model_executor/models/config.py", "100",
                                           "cache_config.cache_dtype = 'fp8_e4m3'",
                                           "GlmMoeDsaForCausalLM.verify_and_update_config"),))
_V33_FA3 = Fact("fa3_call", "flash_attn_varlen_func(q=q_rope, k=k_pe cache, v=latent cache, q_v=q_nope, "
                "block_table=top-k indices, seqused_k, fa_version=3)", "FA3 sparse runs the real heads (no concat, no "
                "padded Q or output)", (src(FA, "245-258", "flash_attn_varlen_func(fa_version=3)",
                                            "FlashAttnMLASparseImpl._forward_mqa_kernel"),))
COMMON = (_V33_PAD, _V33_WS, _V33_WS_FP8, _V33_PADCALL, _V33_DECODE, _V33_BACKENDS, _V33_ROUTE, _V33_INDEXER,
               _V33_CG, _V33_KV, _V33_FA3)

PRESET = EnginePreset(
    "vllm@0.33.0", RELEASE, "defaults: sm90 bf16 FA3 sparse (real heads); short prefills dense MHA",
    version_rule("vllm@0.33.0", COMMON, "fa3-sparse", "topk", ("deepseek", "glm"), backend="FLASH_ATTN_MLA_SPARSE"),
    None, COMMON, members=("fa3_sparse",), uniform_decodes=("FLASHMLA_SPARSE",), order=5,
    first_names=("vllm-fa3-sparse",), today=True)
