"""How every output names the strategies whose canonical name alone would mislead, and the line it prints beside
them (through :func:`mla_lab.placement.preset_label` / :func:`mla_lab.placement.strategy_notes`). Plain strings."""

from __future__ import annotations

__all__ = ["KERNEL_NATIVE_MEASURED", "KERNEL_NATIVE_LABEL", "KERNEL_NATIVE_NOTE", "SGLANG_DENSE_LABEL",
           "SGLANG_DENSE_NOTE", "PACKED_LABEL", "PACKED_NOTE"]

#: The seed step's kernels on one H200 (ms, median over 5 fresh processes; GLM-5 TP8): data/measured/h200/
#: between_process/engine_kernels.csv, ``shape == "seed"``, ``H == 8`` (tests/test_kernel_native_label.py).
KERNEL_NATIVE_MEASURED = {"flashmla_vllm_native": 2.73, "flashmla_vllm_pad64": 2.49, "fa3_sparse": 2.21,
                          "sglang_triton": 2.35, "gather_only": 1.61}
#: How every output names ``kernel_native`` (canonical name unchanged; ``kernel-native`` is its door name).
KERNEL_NATIVE_LABEL = "real-head FlashMLA (modelled)"
_m = KERNEL_NATIVE_MEASURED
#: The one sentence every output gives beside ``kernel_native``'s figure (advise, serve, the report, the explorer).
KERNEL_NATIVE_NOTE = (
    f"{KERNEL_NATIVE_LABEL}: a FlashMLA-style kernel taking the real head count, which no engine's backend runs (vLLM's FLASHMLA_SPARSE pads to 64; "
    "FA3 sparse is the shipping real-head kernel); priced as "
    "the padded kernel's time without the padded heads' Q reads and output writes, always on the sparse route (no dense MHA for short "
    "prompts), so it is shown, not ranked, and is no lower limit of the strategies beside it: on an H200 at the "
    f"seed step vLLM 0.33.0's FlashMLA run with h_q = 8 measured {_m['flashmla_vllm_native']:.2f} ms, slower than "
    f"padded to 64 heads ({_m['flashmla_vllm_pad64']:.2f} ms), FA3 sparse {_m['fa3_sparse']:.2f} ms, the top-k "
    f"gather alone {_m['gather_only']:.2f} ms (data/measured/h200/between_process/engine_kernels.csv)")
del _m
#: How outputs label preset ``sglang-dense``: not SGLang's default today (that is ``sglang@0.5.23``).
SGLANG_DENSE_LABEL = "sglang-dense (prefill graphs off)"
#: The line an output prints beside ``per_call_zeros@sglang-dense``.
SGLANG_DENSE_NOTE = (f"{SGLANG_DENSE_LABEL} = SGLang's documented dense route (dense MHA for prefills of "
                     "<= 2048 tokens), which SGLang 0.5.23 takes on an H200 only with its prefill CUDA graphs off; "
                     "its default there runs prompts of <= 8192 tokens inside breakable prefill CUDA graphs on "
                     "padded flashmla_sparse with a new_zeros pad (engine preset sglang@0.5.23, a code reading)")
#: How every output names ``packed`` (the lab's packed sparse-MLA prefill kernel, mla_lab/kernels/packed.py).
PACKED_LABEL = "packed (mla_lab kernel: 8 tokens x 8 heads per tile; measured kernel, modelled step)"
#: The line an output prints beside ``packed``.
PACKED_NOTE = (
    f"{PACKED_LABEL}: the lab's kernel, in no engine; its kernel time per layer is fitted on the H200 rows of "
    "data/measured/h200/between_process/packed_kernels.csv by union size (data/calibration/h200_packed.csv), the "
    "union size of each step follows from the prompts' positions up to the top-k and from an ASSUMED pairwise "
    "overlap past it (packed:<overlap>; default the TensorRT-LLM tech blog 21 figure, about 44 %); where packing is "
    "predicted slower than 0.98 x padded FlashMLA the step is priced on the fallback (vLLM 0.33.0's FA3 sparse); "
    "every prefill takes the sparse route, decode FA3 sparse; memory = Q at the real heads + the union buffers, no "
    "padded workspace; on Blackwell modelled (no Blackwell measurement)")
