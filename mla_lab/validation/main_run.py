"""vLLM PR #53878's "main" run scored and decomposed (issue 30): where the lab's prediction missed a third of it.

The run (the PR's description; vLLM main before the PR, GLM-5.2-FP8 TP8 EP, 32 x 1024 in / 128 out, concurrency 32,
request rate inf): benchmark duration 9.92 s, request throughput 3.23 req/s, output token throughput 413.04 tok/s
(:data:`REAL`). The lab's prediction, committed before that run was read (``data/validation/
pr53878_main_prediction.json``, commit 3ef3de1), said 6.70 s [6.63, 6.78], 4.77 req/s, 611 tok/s.

:func:`decompose` (``python -m mla_lab.validation.main_run --write``) writes
``data/validation/pr53878_main_decomposition.json``:

- **score**: prediction vs run, ratio per metric (validation, not a fit);
- **consistent pairs**: a run of 32 requests at concurrency 32 ends when the last request's 128th token arrives,
  ``duration ~ TTFT_last + 127 x TPOT``: the (TTFT_last, TPOT) pairs consistent with 9.92 s, beside the lab's own;
- **components**: each candidate for the missing ~3.2 s, its per-step time in the lab's model, its status
  (``measured`` on the H200 with the engine's own kernel, ``measured-fit``, ``cited``, ``assumed``, ``code
  reading``) and the share of the gap it would close: a component's ``closes_s`` is the duration change when it
  alone moves from the lab's value to the stated alternative (all 127 decode steps, or the first steps for cold
  costs);
- **revised**: the lab's deterministic run today (decode kernels priced by their parallelism from the engines'
  own kernels, ``data/calibration/h200_decode_kernels.csv``). It was made after the run was read: in-sample for this
  run, not a prediction.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from ..deployment import Deployment
from ..model.calibration import resolve_calibration
from ..model.decode_calibration import load_decode_calibration
from ..model.ops import layer_ops
from ..model.timing import op_time_ms
from ..paths import REPO_ROOT
from ..provenance import git_commit
from ..serving import PR_BENCH, EnginePricer, SchedulerConfig, serve_benchmark
from ..serving.noise import NoiseConfig, simulate_once
from ..serving.step import DecodeToken, Step
from ..workload import Step as WorkStep
from . import BLIND_RESULTS, write_record
from . import PR53878_DECOMPOSITION as OUT
from . import PR53878_PREDICTION as PREDICTION_FILE

__all__ = ["REAL", "PREDICTION_FILE", "OUT", "decompose", "decode_step_parts", "main", "first_token",
           "FIRST_TOKEN_COMPONENTS", "FIRST_TOKEN_CSV", "first_token_measured"]

REAL = {"duration": 9.92, "request_throughput": 3.23, "output_throughput": 413.04,
        "source": "vLLM PR #53878 description, 'main' run (vLLM main before the PR, GLM-5.2-FP8 TP8 EP, "
                  "vllm bench serve 32 x 1024 / 128, concurrency 32, rate inf)"}
MODEL, TP, ARCH, BEFORE = "glm-5.2", 8, "h200", "per_call_empty:zeros"
BATCH, CTX, STEPS = 32, 1024 + 64, 127  # the mid-run decode step: 32 requests, 1088-key context, 127 steps after TTFT
MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, BLOCK_SIZE = 16384, 256, 64


def _deployment() -> Deployment:
    """The run's deployment: the PR's (:meth:`Deployment.seed`: fp8 weights, EP, bf16 KV, PR_BENCH's workload) on
    GLM-5.2."""
    return Deployment.seed(model=MODEL, tp=TP, arch=ARCH, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                           max_num_seqs=MAX_NUM_SEQS)


def decode_step_parts(strategy: str = BEFORE, graph: bool = True) -> dict:
    """The lab's decode step of the run (32 tokens, 1088-key contexts) on one rank: ``total_ms`` and ``by_op`` (ms
    over the 78 layers), :meth:`mla_lab.serving.EnginePricer.price`."""
    p = EnginePricer(_deployment().rank, strategy)
    dec = tuple(DecodeToken(i, CTX) for i in range(BATCH))
    st = Step(decode=dec, cudagraph_mode="FULL", cudagraph_num_tokens=BATCH) if graph else Step(decode=dec)
    r = p.price(st)
    return {"total_ms": float(r["total_ms"]), "gpu_ms": float(r["gpu_ms"]), "host_ms": float(r["host_ms"]),
            "by_op": {k: float(v) for k, v in r["by_op"].items()}, "n_ops": p.n_ops}


def _revised() -> dict:
    dep = _deployment()
    cap = serve_benchmark(dep, [BEFORE], PR_BENCH, block_size=BLOCK_SIZE)["strategies"][BEFORE]["kv_capacity_tokens"]
    pred = json.loads(PREDICTION_FILE.read_text())
    noise = NoiseConfig.from_record(pred["noise"])
    sched = SchedulerConfig(MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, cap, BLOCK_SIZE, async_scheduling=True)
    m = simulate_once(replace(PR_BENCH, seed=12345), sched, EnginePricer(dep.rank, BEFORE),
                      noise.without_noise()).metrics
    return {k: float(m[k]) for k in ("duration", "request_throughput", "output_throughput", "mean_ttft_ms",
                                     "p99_ttft_ms", "mean_tpot_ms")}


def decompose() -> dict:
    """Everything the decomposition file holds (module docstring)."""
    pred = json.loads(PREDICTION_FILE.read_text())["prediction"]
    score = []
    for k in ("duration", "request_throughput", "output_throughput"):
        p = pred[k]
        score.append({"metric": k, "predicted": p["deterministic"], "band95": p["band95"], "real": REAL[k],
                      "ratio_predicted_over_real": p["deterministic"] / REAL[k],
                      "inside_band": p["band95"][0] <= REAL[k] <= p["band95"][1]})
    lab_ttft_last_s = pred["p99_ttft_ms"]["deterministic"] / 1e3
    lab_tpot = pred["mean_tpot_ms"]["deterministic"]
    gap_s = REAL["duration"] - pred["duration"]["deterministic"]
    pairs = [{"ttft_last_s": round(t, 3), "tpot_ms": round((REAL["duration"] - t) / STEPS * 1e3, 2)}
             for t in (lab_ttft_last_s, 2.0, 3.0, REAL["duration"] - STEPS * lab_tpot / 1e3)]
    g = decode_step_parts(graph=True)
    e = decode_step_parts(graph=False)
    by = g["by_op"]
    moe = by.get("moe_gate_up", 0) + by.get("moe_down", 0)
    comm = sum(v for k, v in by.items() if k.endswith("allreduce"))
    per_step_gap = gap_s / STEPS * 1e3

    old = _old_kernel_ms()
    comps = [
        {"component": "padded decode attention kernel (FlashMLA, 64 heads, B 32, 1088 keys)",
         "status": "measured (vLLM 0.33.0's bundled FlashMLA on the H200, engine_kernels.csv; model "
                   "h200_decode_kernels.csv)", "lab_ms_per_step": by["kernel"],
         "alternative_ms_per_step": old, "alternative": "the lab's earlier decode-kernel fit (h200_decode.csv)",
         "closes_s": (by["kernel"] - old) * STEPS / 1e3},
        {"component": "routed experts at decode (fp8, EP8, 32 tokens x top-8)",
         "status": "measured-fit on torch._scaled_grouped_mm (moe_decode.csv); vLLM's own fused-MoE kernel not run",
         "lab_ms_per_step": moe,
         "alternative_ms_per_step": moe + per_step_gap,
         "alternative": f"the MoE alone closing the gap needs {100 * (moe + per_step_gap) / moe - 100:.0f} % more "
                        "time than the grouped-GEMM fit (an engine kernel at that share of its bandwidth)",
         "closes_s": None},
        {"component": "all-reduces (2 per layer + embedding + logits)", "status": "assumed (cited): 26 us latency "
         "below 24 MiB, NVIDIA/nccl#1453; vLLM's custom all-reduce inside graphs may cost less",
         "lab_ms_per_step": comm, "alternative_ms_per_step": None, "alternative": "", "closes_s": None},
        {"component": "indexer at decode (logits + top-k over the growing context)",
         "status": "measured-fit (h200_decode.csv, round-2 decode rows)",
         "lab_ms_per_step": by.get("idx_logits", 0) + by.get("idx_topk", 0) + by.get("idx_wq_b", 0)
         + by.get("idx_wk", 0) + by.get("idx_weights_proj", 0) + by.get("idx_prep", 0),
         "alternative_ms_per_step": None, "alternative": "", "closes_s": None},
        {"component": "sampler and logits (lm_head, logits all-gather; greedy at temperature 0)",
         "status": "modelled (roofline); the sampler itself assumed negligible",
         "lab_ms_per_step": by.get("lm_head", 0) + by.get("logits_gather", 0),
         "alternative_ms_per_step": None, "alternative": "", "closes_s": None},
        {"component": "decode steps launched eagerly instead of one full CUDA graph",
         "status": "code reading: unlikely (vLLM 0.24.0 FLASHMLA_SPARSE and the indexer declare UNIFORM_BATCH "
                   "cudagraph support, flashmla_sparse.py:232, indexer.py:241; FULL_AND_PIECEWISE is v1's "
                   "default); the eager figure is the lab's launch model (30.25 us per op, measured)",
         "lab_ms_per_step": g["total_ms"], "alternative_ms_per_step": e["total_ms"],
         "alternative": f"eager: {e['n_ops']} launches per step, host-bound",
         "closes_s": (e["total_ms"] - g["total_ms"]) * STEPS / 1e3},
        {"component": "per-step CPU time (scheduling, input prep, output processing)",
         "status": "assumed 2 ms per step, hidden behind the GPU under async scheduling (cited: on by default)",
         "lab_ms_per_step": 0.0, "alternative_ms_per_step": 2.0,
         "alternative": "not hidden (async scheduling off)", "closes_s": 2.0 * (STEPS + 2) / 1e3},
        {"component": "first steps' cold costs (allocator growth, first use of a shape)",
         "status": "measured for the attention and MoE blocks (cold_start.csv: +0.12 ms at call 2); JIT "
                   "compilation of a shape the client's one warm-up request did not reach: not measured",
         "lab_ms_per_step": None, "alternative_ms_per_step": None, "alternative": "", "closes_s": 0.00012},
        {"component": "API server, detokenisation and streaming of 32 concurrent requests",
         "status": "assumed (1.4 ms per request arrival, 1 ms delivery per step: docs/serving.md)",
         "lab_ms_per_step": 1.0, "alternative_ms_per_step": None, "alternative": "", "closes_s": None},
    ]
    for c in comps:
        c["share_of_gap"] = None if c["closes_s"] is None else c["closes_s"] / gap_s
    cross = _cross_check()
    first = first_token(cross["implied_ttft_last_s"] - lab_ttft_last_s)
    return {"what": "vLLM PR #53878's main run scored against the lab's blind prediction, and the gap decomposed",
            "produced_by": "python -m mla_lab.validation.main_run --write", "git_commit": git_commit(),
            "real": REAL, "prediction_file": str(PREDICTION_FILE.relative_to(REPO_ROOT)), "score": score,
            "gap_s": gap_s, "lab_ttft_last_s": lab_ttft_last_s, "lab_tpot_ms": lab_tpot,
            "consistent_pairs": pairs, "decode_step_graph_ms": g["total_ms"], "decode_step_eager_ms": e["total_ms"],
            "components": comps, "cross_check": cross, "first_token": first,
            "revised": {**_revised(), "note": "the lab's deterministic run today (decode kernels from the engines' "
                        "own kernels); made after the run was read: in-sample for this run, not a prediction"}}


def _cross_check() -> dict:
    """What another public run of the same vLLM era says about the decode step: vLLM PR #46189's GLM-5.1-FP8 TP8
    Hopper table (data/validation/blind_2026-12_results.json), FLASHMLA_SPARSE, 512 in / 512 out: mean TPOT at
    concurrency 8 and 64, interpolated log-linearly in the batch to 32; the TTFT of the last request that the PR's
    9.92 s then implies. A cross-check, not a fit: GLM-5.1 runs the indexer on every layer (GLM-5.2 on 21 of 78), so
    its decode step is if anything slower than GLM-5.2's."""
    import math

    res = json.loads(BLIND_RESULTS.read_text())
    case = next(c for c in res["cases"] if c["id"] == "pr46189")
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


#: The first token's candidates (issue 37): what the last request's TTFT may pay beyond the lab's 1.34 s, each with
#: its status (measured: an H200 row; cited: a public source with its figure; assumed) and the seconds it explains
#: *in this run* (``seconds``: None where a source shows the mechanism but not its size here; ``range_s``: what the
#: sources allow). Only measured or cited components with a stated size count towards the explained share.
FIRST_TOKEN_COMPONENTS = (
    {"component": "DeepGEMM JIT of the fp8 linear and grouped-MoE GEMMs at a new token count",
     "status": "cited", "seconds": 0.0, "range_s": [0.0, 0.0],
     "source": "vLLM PR #22215 (merged 2025-08): a 'Kernel Warmup' phase at start-up invokes DeepGEMM's fp8_gemm_nt "
               "and m_grouped_fp8_gemm_nt_contiguous at every possible M so no JIT happens in the hot path (its "
               "test: 83 s and 48 s of warm-up at start-up); the PR's main run is later vLLM main"},
    {"component": "DeepGEMM JIT of kernels outside that warm-up (the indexer's fp8 MQA logits at a new prefill shape)",
     "status": "cited (mechanism and per-cubin size; whether this run hit it: not known)", "seconds": None,
     "range_s": [0.0, 14.3],
     "source": "vLLM issue #49905 (2026-07): the warm-up covers 2 of the 24 DeepGEMM entry points, the rest JIT-load "
               "on first use of a shape key during serving; lightseekorg/tokenspeed PR #398: the first prefill "
               "request of DeepSeek-V4 compiled ~8 cubins, 14.6 s on B200 against 0.32 s warmed (cold on-disk "
               "cache); with ~/.deep_gemm already holding the cubins from an earlier run it is a load, not a compile; "
               "vLLM PR #56452 (2026-09): layers the warm-up missed made kernels 'JIT compile during requests, "
               "producing 10-20 second stalls'"},
    {"component": "Triton JIT at a new specialisation (token counts, block tables) in the first mixed steps",
     "status": "cited (mechanism and size for other models; for this run: not known)", "seconds": None,
     "range_s": [0.0, 1.5],
     "source": "vLLM PR #45631 (Triton recompile detection, jit_monitor.py): '_zero_kv_blocks_kernel', "
               "'_compute_slot_mapping_kernel' compiled during inference; vLLM issue #39790: the first prompt's "
               "TTFT 1537 ms vs ~58 ms for prompts 2-50 on an H100 (lazy Triton and torch.compile on the first "
               "real call); vLLM 0.33.0 compiles registered Triton/TileLang/CuTeDSL kernels at start-up "
               "(kernel_config.enable_jit_warmup, default True, vllm/config/kernel.py:296; "
               "vllm/model_executor/warmup/kernel_warmup.py:177-194), a later addition whose presence in the PR's "
               "main build is not known; measured for the lab's own Triton kernel: "
               "mla_lab/measure/experiments/first_token.py (first_token.csv)"},
    {"component": "CUDA-graph capture or replay misses",
     "status": "cited (code reading)", "seconds": 0.0, "range_s": [0.0, 0.0],
     "source": "batch 32 is one of vLLM v1's default cudagraph_capture_sizes (1, 2, 4, then multiples of 8 up to 256), so the "
               "decode steps replay a captured graph with no padding; prefill steps above the largest capture size "
               "run piecewise and the lab already prices them so"},
    {"component": "first use of a kernel in the process (module load, GEMM heuristics, first launch)",
     "status": "cited (code reading; its size measured in a fresh process)", "seconds": 0.0, "range_s": [0.0, 1.45],
     "source": "data/measured/h200/between_process/cold_start.csv, call 1 over the steady state (median of 5 fresh "
               "processes): FlashMLA attention path +1447 ms, attention block +104 ms, MoE block (grouped GEMM) +237 "
               "ms; vLLM pays these before the first request: compile_or_warm_up_model runs the model at its warm-up "
               "sizes and kernel_warmup before serving (vllm/v1/worker/gpu_worker.py:970-982 at 0.33.0)"},
    {"component": "allocator growth from the post-capture caching allocator to the first 16384-token step's peak",
     "status": "measured (an upper bound only)", "seconds": None, "range_s": [0.0, 0.104],
     "source": "the last warm-up run before serving is max_num_reqs tokens with CUDA graphs off, placed after "
               "capture_model so that empty_cache does not free its buffers (gpu_worker.py:1068-1090 at 0.33.0): "
               "the first full prefill step grows the allocator again; bounded by the attention block's whole "
               "call-1 extra (+104 ms, cold_start.csv, which also holds its first launch); "
               "mla_lab/measure/experiments/first_token.py measures the growth alone (first_token.csv)"},
    {"component": "the indexer at long context", "status": "measured (the lab's indexer rows)", "seconds": 0.0,
     "range_s": [0.0, 0.0],
     "source": "1024-token prompts are below index_topk 2048: every key is selected; the lab prices the indexer's "
               "prefill from its H200 fit (data/calibration/h200_ops.csv), already in the 1.34 s"},
    {"component": "API server, tokenizer, HTTP and streaming (TTFT measured at the client)",
     "status": "assumed", "seconds": 0.045, "range_s": [0.0, 0.5],
     "source": "the lab's arrival model: 1.4 ms per request through the API server, 32 requests (docs/serving.md, "
               "serving/noise.py ArrivalModel); no public figure for this run"},
)


#: The first_token experiment's rows (mla_lab/measure/experiments/first_token.py): 5 fresh processes on the H200,
#: commit 0bbb393, an empty Triton cache per process (``triton_cache`` cold).
FIRST_TOKEN_CSV = REPO_ROOT / "data" / "measured" / "h200" / "between_process" / "first_token.csv"
#: component (its first words in :data:`FIRST_TOKEN_COMPONENTS`) -> the rows of FIRST_TOKEN_CSV that measure it:
#: ``(what, T, name)``: the call-1 cost over the steady state at that shape
_MEASURED_ROWS = {
    "Triton JIT": (("triton_jit:concat_mla_q", 1024, "cold compile at the first shape (the ready-check's 1024 "
                                                      "tokens)"),
                   ("triton_jit:concat_mla_q", 16383, "a new specialisation (16383 tokens, not a multiple of 16)"),
                   ("triton_jit:concat_mla_q", 16384, "a new token count of the same specialisation (16384)")),
    "allocator growth": (("alloc_growth:workspace+moe_block", 16384, "the seed step's workspace fill + one layer's "
                                                                     "routed-expert block from an empty allocator"),),
}


def first_token_measured(path=FIRST_TOKEN_CSV) -> dict:
    """What the first_token experiment measured, per component of :data:`_MEASURED_ROWS`: for each shape, call 1's
    host wall time over the steady median of its process (ms), median and [min, max] over the fresh processes, and
    for the allocator the reserved growth (MiB). Returns ``{component: {"rows": [...], "source"}}``.

    Raises:
        ValueError: the file lacks a column or a (what, T) row it needs (names it).
    """
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
            row = {"what": what, "T": T, "shape": name, "call1_over_steady_ms": float(extra.median()),
                   "min_ms": float(extra.min()), "max_ms": float(extra.max()), "processes": int(first["process"].nunique())}
            grow = first["reserved_after_mib"] - first["reserved_before_mib"]
            if grow.notna().any():
                row["reserved_growth_mib"] = float(grow.median())
            rows.append(row)
        out[comp] = {"rows": rows, "source": f"{path.relative_to(REPO_ROOT) if hasattr(path, 'relative_to') else path}"
                     f" (commit {df['git_commit'].iloc[0][:7]}, {df['device'].iloc[0]}, median over "
                     f"{df['process'].nunique()} fresh processes; host wall ms of call 1 over the process's steady "
                     "median)"}
    return out


def _with_measured(c: dict, measured: dict) -> dict:
    """A component of :data:`FIRST_TOKEN_COMPONENTS` with its H200 measurement where the experiment has one: the
    status becomes ``measured``, the size on the H200 is attached, the share of this run's gap (``seconds``) stays
    what the decomposition argues (vLLM warms these up at start-up: the ``source``)."""
    key = next((k for k in measured if c["component"].startswith(k) or k in c["component"]), None)
    if key is None:
        return c
    m = measured[key]
    sizes = "; ".join(f"{r['shape']}: +{r['call1_over_steady_ms']:.1f} ms [{r['min_ms']:.1f}, {r['max_ms']:.1f}]"
                      + (f", reserved +{r['reserved_growth_mib']:.0f} MiB" if "reserved_growth_mib" in r else "")
                      for r in m["rows"])
    return {**c, "status": "measured (its size on the H200; its share of this run's gap as argued: vLLM warms up "
                           "at start-up)", "measured": m["rows"], "measured_source": m["source"],
            "measured_summary": sizes}


def first_token(gap_s: float) -> dict:
    """The first-token gap (``gap_s``: the implied TTFT of the last request minus the lab's) split over
    :data:`FIRST_TOKEN_COMPONENTS`: each component's share, and the share explained by measured or cited
    components with a stated size (the issue's target: >= 80 %)."""
    rows = []
    measured = first_token_measured()
    for c in (_with_measured(c, measured) for c in FIRST_TOKEN_COMPONENTS):
        share = None if c["seconds"] is None else c["seconds"] / gap_s
        rows.append({**c, "share_of_gap": share})
    sized = [r for r in rows if r["seconds"] is not None and not r["status"].startswith("assumed")]
    explained = sum(r["seconds"] for r in sized)
    return {"gap_s": gap_s, "components": rows, "explained_s": explained, "explained_share": explained / gap_s,
            "target_share": 0.8, "target_met": explained / gap_s >= 0.8,
            "note": "the two cited mechanisms that reach seconds (DeepGEMM JIT of unwarmed kernels, Triton JIT at "
                    "new specialisations) have no stated size for this run, so they explain nothing here; measured "
                    "and cited components with a size explain "
                    f"{100 * explained / gap_s:.0f} % of the {gap_s:.2f} s: the target (80 %) is missed by "
                    f"{80 - 100 * explained / gap_s:.0f} points; nothing is fitted"}


def _old_kernel_ms() -> float:
    """The decode kernel of the step under the lab's earlier fit (KernelDecode, h200_decode.csv), 78 layers."""
    rank = _deployment().rank  # the run's rank: GLM-5.2-FP8 TP8, experts ep, bf16 KV
    model, arch, dcal = rank.model, rank.arch, load_decode_calibration()
    gcal = dcal.graph_calibration(resolve_calibration(None))
    ws = WorkStep([(i, CTX - 1, 1) for i in range(BATCH)])
    op = next(o for o in layer_ops(rank, BEFORE, ws, layer_kind="moe") if o.name == "kernel")
    keys = min(CTX, model.topk)
    per = dcal.kernel_decode.ms(op_time_ms(op, arch, gcal), keys, keys * BATCH, model.head_size * 2, arch)
    return max(op_time_ms(op, arch, gcal), per) * model.num_hidden_layers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.validation.main_run")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(REPO_ROOT)}")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    d = decompose()
    for s in d["score"]:
        print(f"{s['metric']}: predicted {s['predicted']:.2f} vs real {s['real']:.2f} "
              f"(ratio {s['ratio_predicted_over_real']:.2f})")
    print(f"gap {d['gap_s']:.2f} s; consistent (TTFT_last, TPOT): {d['consistent_pairs']}")
    for c in d["components"]:
        share = "" if c["share_of_gap"] is None else f", closes {c['closes_s']:.2f} s = {100 * c['share_of_gap']:.0f} %"
        lab = "-" if c["lab_ms_per_step"] is None else f"{c['lab_ms_per_step']:.2f} ms/step"
        print(f"- {c['component']}: {lab}{share} [{c['status'][:60]}]")
    print(f"revised (in-sample): {d['revised']}")
    if a.write:
        write_record(OUT, d, a.overwrite, ap)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
