"""The measured sweep on a GPU without the notebook toolchain: ``mla_lab.sweep.run_sweep`` with ``device=cuda``.

    python -m mla_lab.sweep.measured --out data/measured/h200/padding_sweep.csv [--quick]

Modelled rows for every arch, and measured rows for the archs of the running GPU's family (the attention path
timed per distinct step, :func:`mla_lab.sweep.rows.measured_rows`). An ``--out`` outside the measured root is
stamped by ``python -m mla_lab.report.stamp_measured`` once copied there.
"""

from __future__ import annotations

import argparse
import sys
import time

from mla_lab.paths import measured_dir
from mla_lab.sweep import run_sweep

GRID = dict(models=["glm-5", "deepseek-v3.2"], tp_sizes=[4, 8], archs=["h200"],
            max_num_batched_tokens=[8192, 16384], prompt_lens=[1024, 8192])

#: The file and its row columns (the sweep's rows, measured and modelled; provenance columns after them).
OUTPUTS = {"padding_sweep.csv": (
    "model tp arch max_num_batched_tokens prompt_len kv_cache_dtype num_prompts concurrency weight_dtype "
    "moe_parallel num_runs shared_workspace_bytes gpu_memory_utilization strategy preset placement content "
    "zero_policy subchunk_rows family prefill_padding num_heads q_concat_heads kernel_heads persistent_bytes "
    "persistent_mib step_transient_bytes kernel_out_bytes call_transient_bytes call_transient_mib peak_bytes "
    "extra_persistent_bytes extra_persistent_mib kv_tokens_lost model_arch status reason ttft_ms ttft_ms_max "
    "num_steps ttft_scope concat_ms pad_ms pad_copy_ms kernel_ms out_slice_ms chunk_out_ms chunk_overhead_ms "
    "calibration kernel_rate_source content_note kv_capacity_tokens kv_capacity_pct_lost "
    "weights_bytes_per_rank fits_in_memory fit_reason ttft_change_pct baseline point_key code_version "
    "ttft_ms_ci_lo ttft_ms_ci_hi ttft_change_ci_lo ttft_change_ci_hi change_measurable attn_path_ms_step0 "
    "attn_path_q1_step0 attn_path_q3_step0 attn_path_ms_steps attn_path_samples_step0 "
    "measured_peak_extra_bytes analytic_peak_extra_bytes kernel_backend concat_backend").split()}
#: (model, tp, max_num_batched_tokens, prompt_len): the grid's points
SHAPES = [(m, tp, n, L) for m in GRID["models"] for tp in GRID["tp_sizes"] for n in GRID["max_num_batched_tokens"]
          for L in GRID["prompt_lens"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="CSV of every row (measured and modelled)")
    ap.add_argument("--store", default="/tmp/mla_lab_measured_store")
    ap.add_argument("--num-runs", type=int, default=11)
    ap.add_argument("--quick", action="store_true", help="one point (GLM-5 TP8, 16384, 1024): a smoke test")
    args = ap.parse_args(argv)
    grid = dict(GRID, models=["glm-5"], tp_sizes=[8], max_num_batched_tokens=[16384], prompt_lens=[1024]) \
        if args.quick else GRID
    params = dict(grid, device="cuda", store_dir=args.store, data_file=args.out, num_runs=args.num_runs,
                  check_equivalence=False, overwrite=True)
    t0 = time.time()
    df = run_sweep(params)
    meas = df[df["source"] == "measured"]
    print(f"{len(df)} rows ({len(meas)} measured, {int((df['status'] != 'ok').sum())} failed) in "
          f"{time.time() - t0:.0f} s -> {args.out}")
    for _, r in df[df["status"] != "ok"].iterrows():
        print("FAILED", r.get("model"), r.get("tp"), r.get("prompt_len"), r.get("reason"))
    cols = ["model", "tp", "max_num_batched_tokens", "prompt_len", "strategy", "attn_path_ms_step0",
            "ttft_ms", "ttft_change_pct", "ttft_change_ci_lo", "ttft_change_ci_hi", "measured_peak_extra_bytes",
            "analytic_peak_extra_bytes"]
    if len(meas):
        print(meas[[c for c in cols if c in meas.columns]].to_string(index=False))
    # the rows are keyed by the model configs they were measured on (issue 24): `mla-lab measure` stamps them after
    # the run; a run of this module alone: python -m mla_lab.report.stamp_measured --root data/measured
    print(f"stamp {args.out} once it lies under {measured_dir()}: python -m mla_lab.report.stamp_measured")
    return 0 if (df["status"] == "ok").all() else 1


if __name__ == "__main__":
    sys.exit(main())
