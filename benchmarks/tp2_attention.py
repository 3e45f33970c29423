"""Benchmark: the sparse-MLA attention block really sharded over 2 GPUs (TP=2, NCCL, one process per GPU) against the
lab's single-GPU simulation (one GPU running one rank's share of the heads) and the all-reduce model term.

For GLM-5 (64 heads -> 32 per rank, padded to 64 on Hopper) and DeepSeek-V3.2 (128 -> 64 per rank, no padding),
T in {4096, 16384} (one causal prompt), strategies unfused and fused: per rank the attention path, W_UV bmm,
row-parallel o_proj (random bf16 weights) and the all-reduce of the [T, hidden] output; medians of --iters calls
after --warmup (CUDA events), peak memory per call, device memory used (NCCL buffers included). Logic and columns:
:mod:`mla_lab.measure.tp` (the TP benchmark harness; the all-reduce model term is
:func:`mla_lab.model.timing.comm_time_ms` at the ideal ring). NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1).

Writes ``data/measured/<arch>x2/tp2_attention.csv`` (``--out`` to change; every row ``measured`` with provenance)
and prints the comparison table. Expected run time on 2 H200s: about 1-2 minutes (process start, NCCL init,
Triton JIT; the timed calls take seconds). Usage::

    python benchmarks/tp2_attention.py                      # 2 GPUs, flash_mla installed
    python benchmarks/tp2_attention.py --cpu-dry-run        # the same logic on CPU (gloo, tiny shapes, reference)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["glm-5", "deepseek-v3.2"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[4096, 16384])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--strategies", nargs="+", default=["unfused", "fused"])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--kernel-backend", default="auto", choices=["auto", "flash_mla", "reference"],
                    help="reference on a GPU gathers [T, topk, 576] per call: only for small --tokens")
    ap.add_argument("--concat-backend", default="auto", choices=["auto", "triton", "torch"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="gloo on CPU, tiny shapes (4 heads, hidden 64), reference kernel: checks the logic only")
    args = ap.parse_args(argv)

    import pandas as pd
    import torch

    from mla_lab.arch import detect_arch
    from mla_lab.kernels import flash_mla_info
    from mla_lab.measure.tp import SAFE_ENV, TPBenchmarkConfig, run_tp_benchmark, summary_table, tiny_overrides
    from mla_lab.paths import measured_dir

    t0 = time.time()
    if args.cpu_dry_run:
        cfg = TPBenchmarkConfig(models=args.models, tokens=[16], tp=args.tp, strategies=args.strategies, device="cpu",
                            warmup=1, iters=3, kernel_backend="reference", concat_backend="torch",
                            model_overrides=tiny_overrides())
        arch = "cpu"
    else:
        n = torch.cuda.device_count()
        if n < args.tp:
            print(f"tp2_attention: needs {args.tp} CUDA GPUs; torch sees {n} (--cpu-dry-run checks the logic on CPU)",
                  file=sys.stderr)
            return 2
        info = flash_mla_info()
        if args.kernel_backend != "reference" and not info["available"]:
            print(f"tp2_attention: flash_mla is not available ({info}); install the gpu extra, or pass "
                  "--kernel-backend reference with small --tokens", file=sys.stderr)
            return 2
        gpu = detect_arch()
        arch = gpu["arch"] or ("b200" if gpu["prefill_padding"] == 128 else "h200")
        cfg = TPBenchmarkConfig(models=args.models, tokens=args.tokens, tp=args.tp, strategies=args.strategies,
                            arch=arch, device="cuda", warmup=args.warmup, iters=args.iters,
                            kernel_backend=args.kernel_backend, concat_backend=args.concat_backend)
        print(f"{n} x {gpu['device']} ({arch}); flash_mla {info.get('provider')} {info.get('version')}; "
              f"env {SAFE_ENV}", flush=True)
    df = run_tp_benchmark(cfg)
    out = Path(args.out) if args.out else (measured_dir(f"{arch}x{args.tp}") / "tp2_attention.csv")
    if args.cpu_dry_run and not args.out:
        out = Path("/tmp") / "tp2_attention_cpu_dry_run.csv"  # never mix a dry run into data/measured
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    cols = ["run", "rank", "model", "T", "strategy", "num_heads", "padded_heads", "attn_ms", "compute_ms", "block_ms",
            "allreduce_ms", "allreduce_model_ms", "peak_extra_bytes", "device_used_bytes", "kernel_backend",
            "concat_backend"]
    print(df[cols].round(3).to_string(index=False))
    print()
    print("TP=2 (slowest rank) vs single-GPU simulation (rank 0's heads on one GPU) + modelled all-reduce:")
    print(summary_table(df).round(3).to_string(index=False))
    print(f"\nwrote {out} ({len(df)} rows) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
