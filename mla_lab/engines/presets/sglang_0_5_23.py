"""Engine version ``sglang@0.5.23``: SGLang 0.5.23 (wheel built 2026-10-30) on an H200: breakable prefill CUDA
graphs up to ``min(8192, chunked_prefill_size)`` tokens force ``use_mha = False``: the indexer + ``flashmla_sparse``
with a ``new_zeros`` pad (64 on sm90, 128 on sm100); decode ``fa3``."""

from ..record import EnginePreset, EngineVersion, Fact, src, version_rule

SD = "sglang/srt/layers/attention/dsa_backend.py"
FACTS = (
    Fact("backend_priority", {"sm90": {"bf16": ("FLASHMLA_SPARSE",)}, "sm100": {"bf16": ("FLASHMLA_SPARSE",)}},
         "bf16 KV: dsa_prefill_backend flashmla_sparse, dsa_decode_backend fa3 on sm90 (trtllm on sm100); the KV "
         "dtype defaults to bf16 on sm90, fp8_e4m3 on sm100", (
             src("sglang/srt/arg_groups/overrides.py", "724", "declared['dsa_prefill_backend'] = 'flashmla_sparse'"),
             src("sglang/srt/arg_groups/overrides.py", "726",
                  "declared['dsa_decode_backend'] = 'trtllm' if major >= 10 else 'fa3'"),
             src("sglang/srt/arg_groups/overrides.py", "533-535",
                  "kv_cache_dtype = 'fp8_e4m3' if major >= 10 and not has_attention_sinks else 'bfloat16'"))),
    Fact("prefill_padding", {"sm90": 64, "sm100": 128}, "_forward_flashmla_sparse pads with new_zeros to 64 (sm90) "
         "or 128 (sm100) per call", (
             src(SD, "2824", "required_padding = 128 if self.device_sm_major >= 10 else 64",
                  "_forward_flashmla_sparse"),
             src(SD, "2835", "q_padded = q_all.new_zeros((num_tokens, required_padding, head_dim))",
                  "_forward_flashmla_sparse"))),
    Fact("pad_call", "new_zeros", "a zeroed pad per call", (
        src(SD, "2835", "q_padded = q_all.new_zeros((num_tokens, required_padding, head_dim))",
             "_forward_flashmla_sparse"),)),
    Fact("prefill_route", {"deepseek": "sparse-mqa-in-graph;dense-if-max_kv_len<=2048",
                           "glm": "sparse-mqa-in-graph;dense-if-max_kv_len<=2048"},
         "dense MHA (MHA_ONE_SHOT) when max_kv_len <= SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD (2048), never "
         "inside a prefill CUDA graph (use_mha = False there)", (
             src(SD, "4050", "is_in_tc_piecewise_cuda_graph() or is_in_breakable_cuda_graph()",
                  "set_dsa_prefill_impl"),
             src(SD, "4071-4072", "max_kv_len <= envs.SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD.get()",
                  "set_dsa_prefill_impl"),
             src("sglang/srt/environ.py", "1983", "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = EnvInt(2048)"))),
    Fact("cuda_graph", {"prefill_graph_max_tokens": 8192},
         "breakable prefill CUDA graphs are the CUDA default, captured up to min(8192, chunked_prefill_size) tokens "
         "for MLA models; chunked_prefill_size 8192 on H200 (H20/H200 memory class)", (
             src("sglang/srt/model_executor/cuda_graph_config.py", "123",
                  "return Backend.BREAKABLE if is_cuda() else Backend.DISABLED", "default_prefill_backend"),
             src("sglang/srt/arg_groups/memory_hook.py", "238",
                  "prefill_cuda_graph_config.max_bs = min(8192, cfg.chunked_prefill_size)"),
             src("sglang/srt/arg_groups/memory_hook.py", "149-153", "declare_resolution(server_args, "
                  "'_handle_gpu_memory_settings', chunked_prefill_size=8192)"))),
    Fact("indexer_skip", "outside prefill graphs, when the dense route is taken", "the indexer runs whenever the "
         "sparse route runs (inside every prefill graph)", ()),
    Fact("triton_prefill", "opt-in triton_sparse_mla prefill: one program per query token, heads padded to a "
         "16-row tile (block_h = max(16, next_power_of_2(H)))", "SGLang's Triton sparse prefill pads to 16 rows", (
             src("sglang/kernels/ops/attention/dsa/triton_sparse_mla_prefill.py", "482",
                  "block_h = max(16, triton.next_power_of_2(h))"),)),
)


PRESET = EnginePreset(
    "sglang@0.5.23", EngineVersion("sglang", "0.5.23", "2026-10-30", "sglang-0.5.23"),
    "H200 defaults: prefill flashmla_sparse (new_zeros pad) inside breakable prefill graphs, decode fa3",
    version_rule("sglang@0.5.23", FACTS, "sparse-mqa", 2048, ("deepseek", "glm"), decode_route="fa3-sparse",
                 all_prefills=False, graph_tokens=FACTS[4].value["prefill_graph_max_tokens"],
                 source_keys=("prefill_route", "cuda_graph", "pad_call")),
    None, FACTS, members=("per_call_zeros",), decode_backend="FLASH_ATTN_MLA_SPARSE", order=7,
    first_names=("sglang", "sglang-flashmla-sparse"), today=True)
