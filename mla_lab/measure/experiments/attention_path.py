"""Benchmark: the sparse-MLA prefill attention path per strategy on the running GPU.

For GLM-5 and DeepSeek-V3.2 at TP {1,2,4,8} (heads per rank) and T {1024, 4096, 16384} tokens in one step, with
causal prompts (one prompt of T tokens, token i sees min(i+1, topk) keys: topk_length) and with full topk (random
indices over s_kv = max(T, topk), no topk_length): the attention path of one layer call per strategy of
:data:`mla_lab.measure.attention.MEASURED_STRATEGIES` (interleaved median and quartiles; rows carry the canonical
``strategy`` and the ``content`` of its padded heads), and the call's peak extra memory against the analytic
accounting (:func:`mla_lab.buffers.call_peak_bytes`).
Also the NaN-padding leak check. The measuring is :mod:`mla_lab.measure.attention` (:func:`time_attention_path`,
:func:`nan_padding_check`); this script loops over the grid and writes the tables.

Prints a table and writes ``data/measured/<gpu>/attention_path.csv`` (``--out`` to change), every row labelled
``measured`` with provenance. Usage::

    python -m mla_lab.measure.experiments.attention_path [--models glm-5 deepseek-v3.2] [--tps 1 2 4 8] [--tokens 1024 4096 16384]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mla_lab.arch import detect_arch
from mla_lab.buffers import call_peak_bytes, padded_num_heads
from mla_lab.measure.attention import MEASURED_STRATEGIES, nan_padding_check, time_attention_path
from mla_lab.models import load_model
from mla_lab.paths import measured_dir
from mla_lab.placement import BASELINE, PR_STRATEGY, parse_strategy
from mla_lab.provenance import provenance
from mla_lab.workload import Step

OUTPUTS = {"attention_path.csv": ["model", "tp", "num_heads", "padded_heads", "T", "topk_mode", "strategy",
                                  "concat_ms", "pad_ms", "kernel_ms", "out_slice_ms", "total_ms", "peak_extra_bytes",
                                  "analytic_peak_extra_bytes", "workspace_bytes", "kernel_backend", "concat_backend",
                                  "arch", "peak_diff_bytes"],
           "nan_padding_check.csv": ["model", "tp", "num_heads", "T", "nan_in_real_heads", "nan_max_abs_diff",
                                     "inf_in_real_heads", "inf_max_abs_diff"]}
PROVENANCE = ("source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp")
#: (model, tp, T, topk mode)
SHAPES = [(m, tp, T, k) for m in ("glm-5", "deepseek-v3.2") for tp in (1, 2, 4, 8) for T in (1024, 4096, 16384)
          for k in ("causal", "full")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["glm-5", "deepseek-v3.2"])
    ap.add_argument("--tps", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1024, 4096, 16384])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import pandas as pd
    import torch


    if not torch.cuda.is_available():
        print("bench_attention: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    gpu = detect_arch()
    arch = gpu["arch"] or ("b200" if gpu["prefill_padding"] == 128 else "h200")
    prov = provenance("measured")
    rows = []
    for m in args.models:
        model = load_model(m)
        for tp in args.tps:
            H = model.heads_per_rank(tp)
            Hp = padded_num_heads(H, arch)
            for T in args.tokens:
                for mode in ("causal", "full_topk"):
                    step = Step([(0, 0, T)])
                    res = time_attention_path(model, tp, step, T, arch, full_topk=(mode == "full_topk"))
                    for s in MEASURED_STRATEGIES:
                        r = res[s]
                        rows.append({
                            "model": m, "tp": tp, "num_heads": H, "padded_heads": Hp, "T": T, "topk_mode": mode,
                            "strategy": s, "content": parse_strategy(s).content, "total_ms": r["total"],
                            "q1_ms": r["q1"], "q3_ms": r["q3"], "peak_extra_bytes": r["peak_bytes"],
                            "analytic_peak_extra_bytes": call_peak_bytes(s, H, T, arch, T, model),
                            "workspace_bytes": r["workspace_bytes"], "kernel_backend": res["kernel_backend"],
                            "concat_backend": res["concat_backend"], "arch": arch, **prov,
                        })
                    print(f"{m} tp{tp} H={H}->{Hp} T={T} {mode}: " + ", ".join(
                        f"{s} {res[s]['total']:.3f} ms" for s in MEASURED_STRATEGIES), flush=True)
    df = pd.DataFrame(rows)
    df["peak_diff_bytes"] = df["peak_extra_bytes"] - df["analytic_peak_extra_bytes"]
    piv = df.pivot_table(index=["model", "tp", "T", "topk_mode"], columns="strategy", values="total_ms")
    piv[f"{PR_STRATEGY}/{BASELINE}"] = piv[PR_STRATEGY] / piv[BASELINE]
    pd.set_option("display.width", 200)
    print(piv.round(3).to_string())
    print(df[["model", "tp", "T", "topk_mode", "strategy", "peak_extra_bytes", "analytic_peak_extra_bytes",
              "peak_diff_bytes"]].to_string())
    out = Path(args.out) if args.out else measured_dir(arch or "gpu") / "attention_path.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    leak = pd.DataFrame([nan_padding_check(m, tp=model_tp, T=4096, prompt_len=4096, arch_name=arch)
                         for m, model_tp in (("glm-5", 8), ("deepseek-v3.2", 8))])
    for k, v in prov.items():
        leak[k] = v
    print(leak.to_string())
    leak.to_csv(out.with_name("nan_padding_check.csv"), index=False)
    print(f"wrote {out} and {out.with_name('nan_padding_check.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
