"""vLLM PR #53878's "main" run (:data:`REAL`) scored against the prediction committed before it was read, its gap
decomposed (issue 30) and the first token explained (issue 37). ``--write``: ``pr53878_main_decomposition.json`` (the
score, the (TTFT_last, TPOT) pairs with ``duration ~ TTFT_last + 127 x TPOT``, each candidate with its status and the
seconds it would close, the revised run: in-sample, not a prediction)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

from ..model.calibration import resolve_calibration
from ..model.decode_calibration import load_decode_calibration
from ..model.ops import layer_ops
from ..model.timing import op_time_ms
from ..paths import REPO_ROOT
from ..provenance import git_commit
from ..serving import PR_BENCH, CostModelPricer, serve_benchmark
from ..serving.benchmark import async_scheduler, pr_deployment
from ..serving.noise import NoiseConfig, simulate_once
from ..serving.step import DecodeToken, Step
from ..workload import Step as WorkStep
from . import BLIND_RESULTS, DIR, PR53878_DECOMPOSITION, PR53878_PREDICTION, write_record

REAL = {"duration": 9.92, "request_throughput": 3.23, "output_throughput": 413.04,
        "source": "vLLM PR #53878 description, 'main' run (vLLM main before the PR, GLM-5.2-FP8 TP8 EP, "
                  "vllm bench serve 32 x 1024 / 128, concurrency 32, rate inf)"}
BEFORE = "per_call_empty:zeros"
BATCH, CTX, STEPS = 32, 1024 + 64, 127  # the mid-run decode step: 32 requests, 1088-key context, 127 steps after TTFT


def decode_step_parts(strategy: str = BEFORE, graph: bool = True) -> dict:
    """The run's decode step (32 tokens, 1088-key contexts) on one rank, ms over the 78 layers."""
    p = CostModelPricer(pr_deployment().rank, strategy)
    dec = tuple(DecodeToken(i, CTX) for i in range(BATCH))
    r = p.price(Step(dec, (), "FULL", BATCH) if graph else Step(dec))
    return {"total_ms": float(r["total_ms"]), "gpu_ms": float(r["gpu_ms"]), "host_ms": float(r["host_ms"]),
            "by_op": {k: float(v) for k, v in r["by_op"].items()}, "n_ops": p.n_ops}


def _revised() -> dict:
    dep = pr_deployment()
    cap = serve_benchmark(dep, [BEFORE], PR_BENCH, block_size=64)["strategies"][BEFORE]["kv_capacity_tokens"]
    noise = NoiseConfig.from_record(json.loads(PR53878_PREDICTION.read_text())["noise"])
    m = simulate_once(replace(PR_BENCH, seed=12345), async_scheduler(dep, cap), CostModelPricer(dep.rank, BEFORE),
                      noise.without_noise()).metrics
    return {k: float(m[k]) for k in ("duration", "request_throughput", "output_throughput", "mean_ttft_ms",
                                     "p99_ttft_ms", "mean_tpot_ms")}


def decompose() -> dict:
    """Everything the decomposition file holds (module docstring)."""
    pred = json.loads(PR53878_PREDICTION.read_text())["prediction"]
    score = [{"metric": k, "predicted": p["deterministic"], "band95": p["band95"], "real": REAL[k],
              "ratio_predicted_over_real": p["deterministic"] / REAL[k],
              "inside_band": p["band95"][0] <= REAL[k] <= p["band95"][1]}
             for k, p in ((k, pred[k]) for k in ("duration", "request_throughput", "output_throughput"))]
    lab_ttft_last_s = pred["p99_ttft_ms"]["deterministic"] / 1e3
    lab_tpot = pred["mean_tpot_ms"]["deterministic"]
    gap_s = REAL["duration"] - pred["duration"]["deterministic"]
    pairs = [{"ttft_last_s": round(t, 3), "tpot_ms": round((REAL["duration"] - t) / STEPS * 1e3, 2)}
             for t in (lab_ttft_last_s, 2.0, 3.0, REAL["duration"] - STEPS * lab_tpot / 1e3)]
    g, e = (decode_step_parts(graph=x) for x in (True, False))
    by = g["by_op"]
    moe = by.get("moe_gate_up", 0) + by.get("moe_down", 0)
    comm = sum(v for k, v in by.items() if k.endswith("allreduce"))
    per_step_gap = gap_s / STEPS * 1e3

    old = _old_kernel_ms()
    idx = sum(by.get(k, 0) for k in ("idx_logits", "idx_topk", "idx_wq_b", "idx_wk", "idx_weights_proj", "idx_prep"))
    fill = {"moe_pct": 100 * (moe + per_step_gap) / moe - 100, "n_ops": e["n_ops"]}
    # (lab_ms_per_step, alternative_ms_per_step, closes_s) per component of COMPONENTS_FILE, in its order
    numbers = [(by["kernel"], old, (by["kernel"] - old) * STEPS / 1e3), (moe, moe + per_step_gap, None),
               (comm, None, None), (idx, None, None), (by.get("lm_head", 0) + by.get("logits_gather", 0), None, None),
               (g["total_ms"], e["total_ms"], (e["total_ms"] - g["total_ms"]) * STEPS / 1e3),
               (0.0, 2.0, 2.0 * (STEPS + 2) / 1e3), (None, None, 0.00012), (1.0, None, None)]
    comps = [{"component": c["component"], "status": c["status"], "lab_ms_per_step": lab,
              "alternative_ms_per_step": alt, "alternative": c["alternative"].format(**fill), "closes_s": closes,
              "share_of_gap": None if closes is None else closes / gap_s}
             for c, (lab, alt, closes) in zip(json.loads(COMPONENTS_FILE.read_text())["components"], numbers,
                                                 strict=True)]
    cross = _cross_check()
    return {"what": "vLLM PR #53878's main run scored against the lab's blind prediction, and the gap decomposed",
            "produced_by": "python -m mla_lab.validation.main_run --write", "git_commit": git_commit(),
            "real": REAL, "prediction_file": str(PR53878_PREDICTION.relative_to(REPO_ROOT)), "score": score,
            "gap_s": gap_s, "lab_ttft_last_s": lab_ttft_last_s, "lab_tpot_ms": lab_tpot,
            "consistent_pairs": pairs, "decode_step_graph_ms": g["total_ms"], "decode_step_eager_ms": e["total_ms"],
            "components": comps, "cross_check": cross,
            "first_token": first_token(cross["implied_ttft_last_s"] - lab_ttft_last_s),
            "revised": {**_revised(), "note": "the lab's deterministic run today (decode kernels from the engines' "
                        "own kernels); made after the run was read: in-sample for this run, not a prediction"}}


def _cross_check() -> dict:
    """A cross-check, not a fit: PR #46189's GLM-5.1 TP8 FLASHMLA_SPARSE mean TPOT (512 / 512) at concurrency 8 and
    64, log-linear to 32, and the last request's TTFT the PR's 9.92 s then implies."""
    case = next(c for c in json.loads(BLIND_RESULTS.read_text())["cases"] if c["id"] == "pr46189")
    tp = {r["workload"]["max_concurrency"]: r["metrics"]["mean_tpot_ms"] for r in case["runs"]
          if r["backend"] == "FLASHMLA_SPARSE" and r["workload"]["random_input_len"] == 512
          and r["workload"]["random_output_len"] == 512}
    a, b = tp[8], tp[64]
    t32 = math.exp(math.log(a) + (math.log(b) - math.log(a)) * (math.log(32) - math.log(8)) / (math.log(64) - math.log(8)))
    return {"source": case["source"], "tpot_ms_conc8": a, "tpot_ms_conc64": b, "tpot_ms_conc32_interpolated": t32,
            "implied_ttft_last_s": REAL["duration"] - STEPS * t32 / 1e3,
            "note": "GLM-5.1-FP8 TP8 on Hopper, FLASHMLA_SPARSE, 512/512: a decode step at 32 requests of about "
                    f"{t32:.0f} ms; the PR's 9.92 s then needs the last request's first "
                    "token at about the implied TTFT: the gap is more likely in the first token (the 32 prompts' "
                    "prefill and cold costs the one 1024-token ready check did not warm) than in the decode steps"}


#: The candidates for the missing time (issue 30): component, status, the alternative priced (prose with sources).
COMPONENTS_FILE = DIR / "pr53878_components.json"
#: The first token's candidates (issue 37), each with its status, sources and the seconds it explains in this run.
FIRST_TOKEN_COMPONENTS_FILE = DIR / "pr53878_first_token_components.json"


#: The first_token experiment's rows (mla_lab/measure/experiments/first_token.py): 5 fresh processes on the H200,
#: commit 0bbb393, an empty Triton cache per process (``triton_cache`` cold).
FIRST_TOKEN_CSV = REPO_ROOT / "data" / "measured" / "h200" / "between_process" / "first_token.csv"
#: component (its first words in :data:`FIRST_TOKEN_COMPONENTS_FILE`) -> the rows of FIRST_TOKEN_CSV that measure it:
#: ``(what, T, name)``: the call-1 cost over the steady state at that shape
_MEASURED_ROWS = {
    "Triton JIT": (("triton_jit:concat_mla_q", 1024, "cold compile at the first shape (the ready-check's 1024 tokens)"),
                   ("triton_jit:concat_mla_q", 16383, "a new specialisation (16383 tokens, not a multiple of 16)"),
                   ("triton_jit:concat_mla_q", 16384, "a new token count of the same specialisation (16384)")),
    "allocator growth": (("alloc_growth:workspace+moe_block", 16384, "the seed step's workspace fill + one layer's "
                                                                     "routed-expert block from an empty allocator"),),
}


def first_token_measured(path=FIRST_TOKEN_CSV) -> dict:
    """Per component of :data:`_MEASURED_ROWS`: call 1's host wall over its process's steady median (ms; median, min,
    max over processes), the reserved growth (MiB). Raises ValueError: a column or (what, T) row missing."""
    import pandas as pd

    df = pd.read_csv(path)
    need = {"process", "what", "T", "call", "wall_ms", "steady_wall_ms", "reserved_before_mib", "reserved_after_mib",
            "git_commit", "device"}
    if need - set(df.columns):
        raise ValueError(f"{path} lacks columns {sorted(need - set(df.columns))}; allowed: first_token.csv as "
                         "mla_lab/measure/experiments/first_token.py writes it")
    out = {}
    for comp, shapes in _MEASURED_ROWS.items():
        rows = []
        for what, T, name in shapes:
            first = df[(df["what"] == what) & (df["T"] == T) & (df["call"] == 1)]
            if first.empty:
                raise ValueError(f"{path} has no call-1 row for what={what!r}, T={T}")
            extra = first["wall_ms"] - first["steady_wall_ms"]
            grow = first["reserved_after_mib"] - first["reserved_before_mib"]
            rows.append({"what": what, "T": T, "shape": name, "call1_over_steady_ms": float(extra.median()),
                         "min_ms": float(extra.min()), "max_ms": float(extra.max()),
                         "processes": int(first["process"].nunique()),
                         **({"reserved_growth_mib": float(grow.median())} if grow.notna().any() else {})})
        out[comp] = {"rows": rows, "source": f"{path.relative_to(REPO_ROOT) if hasattr(path, 'relative_to') else path}"
                     f" (commit {df['git_commit'].iloc[0][:7]}, {df['device'].iloc[0]}, median over "
                     f"{df['process'].nunique()} fresh processes; host wall ms of call 1 over the process's steady "
                     "median)"}
    return out


def first_token(gap_s: float) -> dict:
    """The first-token gap (``gap_s``, s) over :data:`FIRST_TOKEN_COMPONENTS_FILE`'s components: each one's share,
    and the share measured or cited components with a size explain (target >= 80 %)."""
    measured, rows = first_token_measured(), []
    for c in json.loads(FIRST_TOKEN_COMPONENTS_FILE.read_text())["components"]:
        key = next((k for k in measured if c["component"].startswith(k) or k in c["component"]), None)
        if key is not None:  # its H200 measurement (its share of the gap stays as argued)
            m = measured[key]
            sizes = "; ".join(f"{r['shape']}: +{r['call1_over_steady_ms']:.1f} ms [{r['min_ms']:.1f}, "
                              f"{r['max_ms']:.1f}]" + (f", reserved +{r['reserved_growth_mib']:.0f} MiB"
                                                       if "reserved_growth_mib" in r else "") for r in m["rows"])
            c = {**c, "status": "measured (its size on the H200; its share of this run's gap as argued: vLLM warms "
                                "up at start-up)", "measured": m["rows"], "measured_source": m["source"],
                 "measured_summary": sizes}
        rows.append({**c, "share_of_gap": None if c["seconds"] is None else c["seconds"] / gap_s})
    explained = sum(r["seconds"] for r in rows if r["seconds"] is not None and not r["status"].startswith("assumed"))
    return {"gap_s": gap_s, "components": rows, "explained_s": explained, "explained_share": explained / gap_s,
            "target_share": 0.8, "target_met": explained / gap_s >= 0.8,
            "note": "the two cited mechanisms that reach seconds (DeepGEMM JIT of unwarmed kernels, Triton JIT at "
                    "new specialisations) have no stated size for this run, so they explain nothing here; measured "
                    "and cited components with a size explain "
                    f"{100 * explained / gap_s:.0f} % of the {gap_s:.2f} s: the target (80 %) is missed by "
                    f"{80 - 100 * explained / gap_s:.0f} points; nothing is fitted"}


def _old_kernel_ms() -> float:
    """The decode kernel of the step under the lab's earlier fit (KernelDecode, h200_decode.csv), 78 layers."""
    rank = pr_deployment().rank  # the run's rank: GLM-5.2-FP8 TP8, experts ep, bf16 KV
    model, arch, dcal = rank.model, rank.arch, load_decode_calibration()
    gcal = dcal.graph_calibration(resolve_calibration(None))
    ws = WorkStep([(i, CTX - 1, 1) for i in range(BATCH)])
    op = next(o for o in layer_ops(rank, BEFORE, ws, layer_kind="moe") if o.name == "kernel")
    keys = min(CTX, model.topk)
    per = dcal.kernel_decode.ms(op_time_ms(op, arch, gcal), keys, keys * BATCH, model.head_size * 2, arch)
    return max(op_time_ms(op, arch, gcal), per) * model.num_hidden_layers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.validation.main_run")
    ap.add_argument("--write", action="store_true", help=f"write {PR53878_DECOMPOSITION.relative_to(REPO_ROOT)}")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    d = decompose()
    print(f"gap {d['gap_s']:.2f} s; revised (in-sample): {d['revised']}")
    if a.write:
        write_record(PR53878_DECOMPOSITION, d, a.overwrite, ap)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
