"""The sparse-MLA prefill attention path per :data:`mla_lab.measure.attention.MEASURED_STRATEGIES` over models x TP
x T (``models``, ``tps``, ``tokens``), one prompt per step, causal and full top-k: interleaved median and quartiles,
the call's peak extra memory against :func:`mla_lab.buffers.call_peak_bytes`; then the NaN-padding leak check
(:func:`~mla_lab.measure.attention.nan_padding_check`). Rows: ``attention_path.csv`` (``concat_ms`` ..
``out_slice_ms`` empty in new rows), ``nan_padding_check.csv``."""

from __future__ import annotations

from mla_lab.buffers import call_peak_bytes
from mla_lab.measure.attention import MEASURED_STRATEGIES, nan_padding_check, time_attention_path
from mla_lab.measure.sink import log
from mla_lab.placement import parse_strategy
from mla_lab.workload import Step

from ._common import ranks_of

OUTPUTS = {"attention_path.csv": ["model", "tp", "num_heads", "padded_heads", "T", "topk_mode", "strategy",
                                  "concat_ms", "pad_ms", "kernel_ms", "out_slice_ms", "total_ms", "peak_extra_bytes",
                                  "analytic_peak_extra_bytes", "workspace_bytes", "kernel_backend", "concat_backend",
                                  "arch", "peak_diff_bytes", "content", "q1_ms", "q3_ms"],
           "nan_padding_check.csv": ["model", "tp", "num_heads", "T", "nan_in_real_heads", "nan_max_abs_diff",
                                     "inf_in_real_heads", "inf_max_abs_diff"]}
#: (model, tp, T, topk mode)
SHAPES = [(m, tp, T, k) for m in ("glm-5", "deepseek-v3.2") for tp in (1, 2, 4, 8) for T in (1024, 4096, 16384)
          for k in ("causal", "full")]


def _point(sink, rank, T: int, mode: str) -> None:
    res = time_attention_path(rank, Step([(0, 0, T)]), T, full_topk=(mode == "full_topk"))
    arch = rank.arch.name
    for s in MEASURED_STRATEGIES:
        r = res[s]
        analytic = call_peak_bytes(s, rank.num_heads, T, arch, T, rank.model)
        sink.write("attention_path.csv", {
            "model": rank.model.name, "tp": rank.tp, "num_heads": rank.num_heads, "padded_heads":
            rank.padded_num_heads, "T": T, "topk_mode": mode, "strategy": s, "content": parse_strategy(s).content,
            "total_ms": r["total"], "q1_ms": r["q1"], "q3_ms": r["q3"], "peak_extra_bytes": r["peak_bytes"],
            "analytic_peak_extra_bytes": analytic, "peak_diff_bytes": r["peak_bytes"] - analytic,
            "workspace_bytes": r["workspace_bytes"], "kernel_backend": res["kernel_backend"],
            "concat_backend": res["concat_backend"], "arch": arch})
    log(f"{rank.model.name} tp{rank.tp} H={rank.num_heads}->{rank.padded_num_heads} T={T} {mode}: "
        + ", ".join(f"{s} {res[s]['total']:.3f} ms" for s in MEASURED_STRATEGIES))


def run(rank, sink, options) -> None:
    """The grid (under smoke: the rank's model at its TP, T 1024), then the leak check at the rank's TP."""
    models = options.param("models", (rank.model.name,) if options.smoke else ("glm-5", "deepseek-v3.2"))
    tps = options.param("tps", (rank.tp,) if options.smoke else (1, 2, 4, 8))
    tokens = options.param("tokens", (1024,) if options.smoke else (1024, 4096, 16384))
    for m in models:
        for tp in tps:
            (r,) = ranks_of(rank, [m], tp=tp)
            for T in tokens:
                for mode in ("causal", "full_topk"):
                    _point(sink, r, T, mode)
    for r in ranks_of(rank, models):
        sink.write("nan_padding_check.csv", nan_padding_check(r, T=1024 if options.smoke else 4096))
