"""The TP benchmark harness: the sparse-MLA attention block really sharded over ``tp`` processes, against the
lab's single-GPU simulation of TP and the cost model's all-reduce.

The lab prices TP by giving one GPU one rank's share of the heads (``num_attention_heads / tp``). This module runs
the attention block really sharded, one process per GPU, and the simulation with the same code:

- **tp run** (``world_size = tp``, NCCL on GPUs, gloo on CPU): rank ``r`` holds heads ``[r H, (r+1) H)`` with
  ``H = num_attention_heads / tp`` (their ``ql_nope``/``q_pe``, their ``W_UV`` slice and their input columns of
  ``o_proj``), the latent KV cache, indices and ``topk_length`` replicated (same seed on every rank). Per rank: the
  attention path of a strategy (:mod:`mla_lab.strategies`: ``unfused`` or ``fused``; concat, pad, sparse prefill,
  slice), then ``W_UV`` (``bmm [H, T, 512] x [H, 512, v_head_dim]``), then the row-parallel ``o_proj``
  (``[T, H v_head_dim] x [H v_head_dim, hidden]``, random bf16 weights), then an all-reduce (sum) of the
  ``[T, hidden]`` bf16 output over the ranks, as vLLM's ``RowParallelLinear`` does.
- **sim run** (``world_size = 1``, no process group): one process runs rank 0's share (``H`` heads) through the
  same function; the all-reduce is skipped. This is what the lab's single-GPU measurements do.
- **all-reduce model**: the cost model's one collective model, :func:`mla_lab.model.timing.comm_time_ms`
  ``("allreduce", B, tp, arch, calibration)`` for ``B = T x hidden x 2`` bytes: a ring all-reduce sends (and
  receives) ``2 (tp-1)/tp x B`` bytes per rank; time = that / (``nvlink_gbps / 2`` x ``comm_efficiency``) +
  ``comm_latency_us``, with :func:`mla_lab.arch.get_arch` ``(arch).nvlink_gbps`` the datasheet NVLink bandwidth of
  both directions together (so ``/ 2`` per direction). Priced with :func:`ideal_ring_calibration`
  (``comm_efficiency`` 1, latency 0: the ideal ring, a lower bound, the same numbers this harness has always
  reported; the TTFT model's default assumes 0.8, :class:`mla_lab.model.calibration.Calibration`).

Per (model, T, strategy) and rank it measures, after ``warmup`` calls, the median of ``iters`` calls (CUDA events on
GPU, :func:`mla_lab.measure.timer.cuda_ms`; wall clock on CPU) of: the attention path alone (``attn_ms``), the block without the all-reduce
(``compute_ms``), the whole block (``block_ms``), and, once per (model, T), an all-reduce of a ``[T, hidden]`` bf16
tensor alone (``allreduce_ms``); every timed call starts after a barrier of all ranks. Memory (CUDA only): bytes
allocated by inputs, weights and workspace (``allocated_bytes``), the block call's peak on top of them
(``peak_extra_bytes``, ``reset_peak_memory_stats`` / ``max_memory_allocated``), and the device's used memory
(``device_used_bytes`` from ``cudaMemGetInfo``: it also holds the CUDA context and NCCL's buffers, which the caching
allocator's statistics do not see).

:func:`compare` joins each tp-run row with the sim row of the same (model, T, strategy) and gives the simulation
error: ``time_error_pct`` = (sim ``compute_ms`` + modelled all-reduce - tp ``block_ms``) / tp ``block_ms``,
``compute_error_pct`` (sim vs tp ``compute_ms``), ``allreduce_model_error_pct`` and ``mem_error_pct`` (peak extra
bytes).

Shared machines: NVLink multicast stays off. :data:`SAFE_ENV` (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``) is set in the parent before the workers are spawned and again in each worker
before ``init_process_group``; rows record the values in force.

The logic runs on CPU (gloo, ``device="cpu"``, the reference kernel, tiny shapes through ``model_overrides``):
``tests/test_tp_check.py``. The GPU run: ``benchmarks/tp2_attention.py``. This module returns measurements
(rows of timings and bytes per rank); it builds no sweep rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..arch import get_arch
from ..buffers import padded_num_heads
from ..kernels import last_backend
from ..model.calibration import Calibration, default_calibration
from ..model.timing import comm_time_ms
from ..models import load_model
from ..provenance import provenance
from ..strategies import REAL_STRATEGIES, make_strategy
from .timer import cuda_ms

__all__ = ["SAFE_ENV", "TPBenchmarkConfig", "make_block_inputs", "block_forward", "ideal_ring_calibration",
           "run_tp_benchmark", "compare", "summary_table", "tiny_overrides"]

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
BF16_BYTES = 2


@dataclass
class TPBenchmarkConfig:
    """What to run.

    Attributes:
        models: model names (``data/models``).
        tokens: step sizes ``T`` (one causal prompt of ``T`` tokens: token ``i`` sees ``min(i + 1, topk)`` keys).
        tp: TP size of the real run (= number of processes / GPUs) and of the simulated share.
        strategies: ``unfused`` and/or ``fused``.
        arch: arch card for the padding rule and the all-reduce model (``None``: the running GPU's, else h200).
        device: ``cuda`` (NCCL, one GPU per rank) or ``cpu`` (gloo; a dry run of the logic).
        warmup, iters: calls before timing, timed calls (median).
        kernel_backend, concat_backend: passed to the strategies (``auto``: FlashMLA / Triton on a GPU).
        seed: inputs' seed.
        model_overrides: ``ModelConfig`` fields to replace (tiny CPU shapes; see :func:`tiny_overrides`).
        save_outputs: also save each rank's block output (``.pt``, for the CPU correctness test).
        runs: which runs: ``tp`` (sharded) and/or ``sim`` (one rank's share on one device).
    """

    models: list = field(default_factory=lambda: ["glm-5", "deepseek-v3.2"])
    tokens: list = field(default_factory=lambda: [4096, 16384])
    tp: int = 2
    strategies: list = field(default_factory=lambda: ["unfused", "fused"])
    arch: str | None = None
    device: str = "cuda"
    warmup: int = 5
    iters: int = 20
    kernel_backend: str = "auto"
    concat_backend: str = "auto"
    seed: int = 0
    model_overrides: dict = field(default_factory=dict)
    save_outputs: bool = False
    runs: list = field(default_factory=lambda: ["tp", "sim"])


def tiny_overrides() -> dict:
    """ModelConfig fields for a CPU dry run: 4 heads (2 per rank at TP=2), hidden 64, v_head_dim 16, topk 32 (the
    absorbed head size stays 576 = 512 + 64, as the kernels require)."""
    return {"num_attention_heads": 4, "hidden_size": 64, "v_head_dim": 16, "index_topk": 32}


def _model(name: str, overrides: dict):
    model = load_model(name)
    return dataclasses.replace(model, **overrides) if overrides else model


def _sm_scale(model) -> float:
    return 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)


def make_block_inputs(model, tp: int, rank: int, T: int, seed: int = 0, device: str = "cpu") -> dict:
    """Inputs and weights of rank ``rank``'s share of one attention block (all bf16 but the int32 indices).

    Replicated on every rank (generator seeded with ``seed``): ``kv [s_kv, 1, 576]`` (``s_kv = max(T, topk)``),
    ``indices [T, 1, topk]`` (causal: token ``i`` draws among keys ``0..i``) and ``topk_length [T]``. Sharded
    (generator seeded with ``seed``, ``rank``): ``ql_nope [T, H, 512]`` (head-major strides, like the transposed
    W_UK bmm output in vLLM), ``q_pe [T, H, 64]`` (a slice of a ``[T, H, qk_nope + 64]`` tensor), ``w_uv [H, 512,
    v_head_dim]`` and ``w_o [hidden, H v_head_dim]`` (``o_proj``'s input columns of these heads).
    Concatenating the shards of ranks ``0..tp-1`` along heads gives the unsharded block's inputs.
    """
    H = model.heads_per_rank(tp)
    topk = model.topk
    gs = torch.Generator(device=device).manual_seed(seed)
    gr = torch.Generator(device=device).manual_seed(seed * 1_000_003 + 1 + rank)
    s_kv = max(T, topk)
    kv = torch.randn(s_kv, 1, model.head_size, device=device, dtype=torch.bfloat16, generator=gs)
    visible = torch.arange(1, T + 1, device=device)
    r = torch.rand(T, topk, device=device, generator=gs)
    idx = (r * visible[:, None]).long().to(torch.int32).view(T, 1, topk)
    tl = torch.clamp(visible, max=topk).to(torch.int32)
    del r
    ql_nope = torch.randn(H, T, model.kv_lora_rank, device=device, dtype=torch.bfloat16, generator=gr).transpose(0, 1)
    q_full = torch.randn(T, H, model.qk_nope_head_dim + model.qk_rope_head_dim, device=device,
                         dtype=torch.bfloat16, generator=gr)
    q_pe = q_full[..., model.qk_nope_head_dim:]
    w_uv = (torch.randn(H, model.kv_lora_rank, model.v_head_dim, device=device, generator=gr)
            / math.sqrt(model.kv_lora_rank)).to(torch.bfloat16)
    w_o = (torch.randn(model.hidden_size, H * model.v_head_dim, device=device, generator=gr)
           / math.sqrt(model.num_attention_heads * model.v_head_dim)).to(torch.bfloat16)
    return {"ql_nope": ql_nope, "q_pe": q_pe, "kv": kv, "indices": idx, "topk_length": tl, "w_uv": w_uv,
            "w_o": w_o, "num_heads": H}


def block_forward(strategy, inp: dict, sm_scale: float, world_size: int = 1, parts: str = "block"):
    """One rank's attention block: strategy (attention path) -> W_UV bmm -> row-parallel o_proj -> all-reduce.

    Args:
        strategy: a :class:`mla_lab.strategies.PrefillStrategy` built for ``inp["num_heads"]`` heads.
        inp: :func:`make_block_inputs`.
        world_size: > 1: sum the ``[T, hidden]`` output over the default process group (in place).
        parts: ``"attn"`` (attention path only), ``"compute"`` (no all-reduce) or ``"block"`` (everything).

    Returns:
        ``[T, H, 512]`` for ``"attn"``, else ``[T, hidden]`` bf16.
    """
    o, _ = strategy(inp["ql_nope"], inp["q_pe"], inp["kv"], inp["indices"], sm_scale, inp["topk_length"])
    if parts == "attn":
        return o
    T, H = o.shape[0], o.shape[1]
    x = torch.bmm(o.transpose(0, 1), inp["w_uv"])  # [H, T, v_head_dim]
    x = x.transpose(0, 1).reshape(T, H * inp["w_uv"].shape[-1])
    y = torch.nn.functional.linear(x, inp["w_o"])  # [T, hidden]: this rank's partial sum
    if parts == "block" and world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(y)
    return y


def ideal_ring_calibration() -> Calibration:
    """The committed calibration with the ideal ring: ``comm_efficiency`` 1, ``comm_latency_us`` 0. With it
    :func:`mla_lab.model.timing.comm_time_ms` ``("allreduce", T x hidden x 2, tp, arch, ...)`` is ``2 (tp-1)/tp x
    T x hidden x 2`` bytes over ``nvlink_gbps / 2`` GB/s (0 for ``tp == 1``): a lower bound, what the
    ``allreduce_model_ms`` column has always held."""
    return default_calibration().with_comm(comm_efficiency=1.0, comm_latency_us=0.0)


# ---------------------------------------------------------------------------------------------------- workers

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync(device: str, world_size: int) -> None:
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()
    if device == "cuda":
        torch.cuda.synchronize()


def _barrier_median_ms(fn, device: str, world_size: int, warmup: int, iters: int) -> float:
    """Median ms of ``iters`` calls after ``warmup``; every call starts after a barrier of all ranks and is timed on
    its own (:func:`mla_lab.measure.timer.cuda_ms` on CUDA; wall clock on CPU, a dry run of the logic)."""
    for _ in range(warmup):
        fn()
    _sync(device, world_size)
    times = []
    for _ in range(iters):
        _sync(device, world_size)
        if device == "cuda":
            times.append(cuda_ms(fn))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _worker(rank: int, world_size: int, run: str, cfg: TPBenchmarkConfig, out_dir: str, port: int) -> None:
    """One process: rank ``rank`` of ``world_size`` (``run="tp"``) or the one-process simulation (``run="sim"``)."""
    os.environ.update(SAFE_ENV)  # before any process group / NCCL communicator exists
    device = cfg.device
    dev = device
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = f"cuda:{rank}"
    backend = None
    if world_size > 1:
        import torch.distributed as dist

        backend = "nccl" if device == "cuda" else "gloo"
        kw = {"device_id": torch.device(dev)} if device == "cuda" else {}
        dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}",
                                **kw)
    arch = get_arch(cfg.arch or "h200")
    calibration = ideal_ring_calibration()
    rows = []
    try:
        _worker_cases(rank, world_size, run, cfg, out_dir, device, dev, backend, arch, calibration, rows)
    except BaseException:
        # no barrier here: the other ranks may sit in a collective; mp.spawn ends them when this one exits
        (Path(out_dir) / f"rows_{run}_r{rank}.json").write_text(json.dumps(rows))
        raise
    (Path(out_dir) / f"rows_{run}_r{rank}.json").write_text(json.dumps(rows))
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def _worker_cases(rank, world_size, run, cfg, out_dir, device, dev, backend, arch, calibration, rows) -> None:
    """Every (model, T, strategy) of ``cfg`` on this rank; rows appended to ``rows`` as they complete."""
    for name in cfg.models:
        model = _model(name, cfg.model_overrides)
        for T in cfg.tokens:
            inp = make_block_inputs(model, cfg.tp, rank, T, cfg.seed, dev)
            ar_ms = None
            if world_size > 1:
                import torch.distributed as dist

                buf = torch.zeros(T, model.hidden_size, device=dev, dtype=torch.bfloat16)
                ar_ms = _barrier_median_ms(lambda b=buf: dist.all_reduce(b), device, world_size, cfg.warmup, cfg.iters)
                del buf
            for s in cfg.strategies:
                row = _measure_strategy(s, model, name, T, inp, rank, world_size, run, cfg, out_dir, device, dev,
                                        backend, arch, calibration)
                row["allreduce_ms"] = ar_ms
                rows.append(row)
                _sync(device, world_size)
            del inp
            if device == "cuda":
                torch.cuda.empty_cache()


def _measure_strategy(s, model, name, T, inp, rank, world_size, run, cfg, out_dir, device, dev, backend, arch,
                      calibration) -> dict:
    H = inp["num_heads"]
    sm = _sm_scale(model)
    strat = make_strategy(s, num_heads=H, max_num_batched_tokens=T, arch=arch.name, device=dev,
                          kernel_backend=cfg.kernel_backend, concat_backend=cfg.concat_backend)
    row = {"run": run, "rank": rank, "world_size": world_size, "dist_backend": backend or "none", "model": name,
           "tp": cfg.tp, "T": T, "strategy": s, "num_heads": H, "padded_heads": padded_num_heads(H, arch.name, "bf16"),
           "hidden_size": model.hidden_size, "v_head_dim": model.v_head_dim, "topk": model.topk, "arch": arch.name,
           "nvlink_gbps": arch.nvlink_gbps, "workspace_bytes": strat.workspace.nbytes,
           **{k: os.environ.get(k, "") for k in SAFE_ENV}}
    y = block_forward(strat, inp, sm, world_size)  # first call (JIT compile, allocator warm-up)
    if cfg.save_outputs:
        torch.save(y.cpu(), Path(out_dir) / f"y_{run}_{name}_{T}_{s}_r{rank}.pt")
    del y
    for parts in ("attn", "compute", "block") if world_size > 1 else ("attn", "compute"):
        row[f"{parts}_ms"] = _barrier_median_ms(lambda p=parts: block_forward(strat, inp, sm, world_size, p),
                                                device, world_size, cfg.warmup, cfg.iters)
    if world_size == 1:  # nothing to reduce: the simulation's block is its compute
        row["block_ms"] = row["compute_ms"]
    row["allreduce_bytes"] = T * model.hidden_size * BF16_BYTES
    row["allreduce_model_ms"] = comm_time_ms("allreduce", row["allreduce_bytes"], cfg.tp, arch, calibration)
    row["kernel_backend"] = str(last_backend("sparse_mla_prefill"))
    row["concat_backend"] = str(last_backend("concat_mla_q"))
    row.update(_memory(device, strat, inp, sm, world_size))
    return row


def _memory(device: str, strat, inp, sm: float, world_size: int) -> dict:
    """Allocated bytes before the call, the call's peak on top, device-level used bytes (CUDA only)."""
    if device != "cuda":
        return {"allocated_bytes": None, "peak_extra_bytes": None, "device_used_bytes": None}
    _sync(device, world_size)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y = block_forward(strat, inp, sm, world_size)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    free, total = torch.cuda.mem_get_info()
    del y
    return {"allocated_bytes": before, "peak_extra_bytes": peak, "device_used_bytes": total - free}


# ---------------------------------------------------------------------------------------------------- driver

def run_tp_benchmark(cfg: TPBenchmarkConfig, out_dir: str | Path | None = None) -> "object":
    """Spawn the tp run (``cfg.tp`` processes) and the sim run (1 process); returns a DataFrame of every rank's rows
    with :func:`mla_lab.provenance.provenance` ``("measured")`` columns and the :func:`compare` columns.

    Raises:
        RuntimeError: ``device="cuda"`` with fewer than ``cfg.tp`` GPUs; a worker failed (its exception).
        ValueError: tp not dividing a model's heads; unknown strategy/run.
    """
    import pandas as pd
    import torch.multiprocessing as mp

    for s in cfg.strategies:
        if s not in ("unfused", "fused") and s not in REAL_STRATEGIES:
            raise ValueError(f"strategies holds {s!r}; allowed: {['unfused', 'fused', *REAL_STRATEGIES]}")
    for r in cfg.runs:
        if r not in ("tp", "sim"):
            raise ValueError(f"runs holds {r!r}; allowed: ['tp', 'sim']")
    if cfg.device not in ("cuda", "cpu"):
        raise ValueError(f"device={cfg.device!r}; allowed: ['cuda', 'cpu']")
    for m in cfg.models:
        _model(m, cfg.model_overrides).heads_per_rank(cfg.tp)  # ValueError early, not in a worker
    if cfg.device == "cuda" and torch.cuda.device_count() < cfg.tp:
        raise RuntimeError(f"tp={cfg.tp} needs {cfg.tp} GPUs; torch sees {torch.cuda.device_count()}")
    os.environ.update(SAFE_ENV)  # inherited by the spawned workers
    with tempfile.TemporaryDirectory(prefix="tp_check_") as tmp:
        work = Path(out_dir) if out_dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "tp" in cfg.runs:
            mp.spawn(_worker, args=(cfg.tp, "tp", cfg, str(work), _free_port()), nprocs=cfg.tp, join=True)
        if "sim" in cfg.runs:
            mp.spawn(_worker, args=(1, "sim", cfg, str(work), _free_port()), nprocs=1, join=True)
        rows = []
        for f in sorted(work.glob("rows_*.json")):
            rows.extend(json.loads(f.read_text()))
    df = pd.DataFrame(rows)
    prov = provenance("measured")
    if cfg.device == "cpu":  # a dry run of the logic: say where it ran
        prov.update(device="cpu", sm="none", driver="none", cuda="none")
    for k, v in prov.items():
        df[k] = v
    return compare(df)


def compare(df):
    """Add the simulation-error columns to the tp-run rows (sim rows get NaN): ``sim_compute_ms``,
    ``sim_peak_extra_bytes``, ``sim_device_used_bytes``, ``time_error_pct``, ``compute_error_pct``,
    ``allreduce_model_error_pct``, ``mem_error_pct``, ``device_used_diff_bytes`` (tp - sim: NCCL's buffers and
    the rest of what the allocator does not see)."""
    import numpy as np
    import pandas as pd

    df = df.copy()
    keys = ["model", "T", "strategy"]
    sim = df[df["run"] == "sim"][keys + ["compute_ms", "peak_extra_bytes", "device_used_bytes"]].rename(
        columns={"compute_ms": "sim_compute_ms", "peak_extra_bytes": "sim_peak_extra_bytes",
                 "device_used_bytes": "sim_device_used_bytes"})
    for c in ("sim_compute_ms", "sim_peak_extra_bytes", "sim_device_used_bytes"):
        if c in df:
            df = df.drop(columns=c)
    out = df.merge(sim, on=keys, how="left")
    tp = out["run"] == "tp"

    def pct(a, b):
        a, b = pd.to_numeric(a, errors="coerce"), pd.to_numeric(b, errors="coerce")
        return (100.0 * (a - b) / b).where(tp & (b > 0))

    out["time_error_pct"] = pct(out["sim_compute_ms"] + out["allreduce_model_ms"], out["block_ms"])
    out["compute_error_pct"] = pct(out["sim_compute_ms"], out["compute_ms"])
    out["allreduce_model_error_pct"] = pct(out["allreduce_model_ms"], out["allreduce_ms"])
    out["mem_error_pct"] = pct(out["sim_peak_extra_bytes"], out["peak_extra_bytes"])
    out["device_used_diff_bytes"] = (pd.to_numeric(out["device_used_bytes"], errors="coerce")
                                     - pd.to_numeric(out["sim_device_used_bytes"], errors="coerce")).where(tp)
    for c in ("sim_compute_ms", "sim_peak_extra_bytes", "sim_device_used_bytes"):
        out[c] = out[c].where(tp, np.nan)
    return out


def summary_table(df):
    """One line per (model, T, strategy): the slowest tp rank's block/compute/all-reduce times, the sim, the model
    and the errors (ms, MiB, %)."""
    import pandas as pd

    tp = df[df["run"] == "tp"]
    if tp.empty:
        return pd.DataFrame()
    g = tp.groupby(["model", "T", "strategy"], sort=False)
    t = pd.DataFrame({
        "heads/rank": g["num_heads"].first(),
        "tp_block_ms": g["block_ms"].max(),
        "tp_compute_ms": g["compute_ms"].max(),
        "tp_allreduce_ms": g["allreduce_ms"].max(),
        "sim_compute_ms": g["sim_compute_ms"].first(),
        "model_allreduce_ms": g["allreduce_model_ms"].first(),
    })
    t["sim+model_ms"] = t["sim_compute_ms"] + t["model_allreduce_ms"]
    t["time_err_%"] = 100 * (t["sim+model_ms"] - t["tp_block_ms"]) / t["tp_block_ms"]
    t["compute_err_%"] = 100 * (t["sim_compute_ms"] - t["tp_compute_ms"]) / t["tp_compute_ms"]
    peak = pd.to_numeric(g["peak_extra_bytes"].max(), errors="coerce")
    sim_peak = pd.to_numeric(g["sim_peak_extra_bytes"].first(), errors="coerce")
    t["tp_peak_MiB"] = peak / 2**20
    t["sim_peak_MiB"] = sim_peak / 2**20
    t["mem_err_%"] = 100 * (sim_peak - peak) / peak
    t["nccl_etc_MiB"] = pd.to_numeric(g["device_used_diff_bytes"].max(), errors="coerce") / 2**20
    return t.reset_index()
