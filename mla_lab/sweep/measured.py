"""The measured sweep on a GPU without the notebook toolchain: ``mla_lab.sweep.run_sweep`` with ``device=cuda``.

    python -m mla_lab.sweep.measured --out data/measured/h200/padding_sweep.csv [--quick]

Every grid point gets modelled rows for every arch of the grid and, for the archs of the running GPU's family,
measured rows: every real strategy's attention path timed per distinct step in ``--num-runs`` interleaved rounds
(:func:`mla_lab.measure.attention.time_attention_path`), the rest of the step modelled
(:func:`mla_lab.sweep.rows.measured_rows`). The report is rendered from the CSV afterwards (``make report`` with
``MLA_LAB_MEASURED`` or the committed ``data/measured``), which needs no GPU. An ``--out`` under the measured root
is stamped afterwards (``mla_lab/report/stamp_measured.py``: the model config digests the rows were measured with);
elsewhere, copy it there and run that script.
"""

from __future__ import annotations

import argparse
import sys
import time

from mla_lab.paths import measured_dir
from mla_lab.sweep import run_sweep

GRID = dict(models=["glm-5", "deepseek-v3.2"], tp_sizes=[4, 8], archs=["h200"],
            max_num_batched_tokens=[8192, 16384], prompt_lens=[1024, 8192])


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
