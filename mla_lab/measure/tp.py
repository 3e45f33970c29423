"""The TP harness: the attention and MoE blocks (:data:`BLOCKS`, per rank: :mod:`.tp_blocks`) sharded over ``tp``
processes (rank ``r`` on GPU ``r``; NCCL, gloo on CPU: a dry run) against the one-GPU simulation of one rank's share
(:data:`RUNS` ``sim``, no all-reduce) and the cost model's all-reduce; plus the all-reduce alone, per rank.

Each case: ``warmup`` calls, then ``iters`` calls each after a barrier of all ranks, each timed on its own (ms).
Rows: :data:`BLOCK_COLUMNS` (memory columns CUDA only; ``nccl_bytes``: growth of ``used - reserved`` over
``init_process_group`` and the first collectives), :data:`ALLREDUCE_COLUMNS` (the comm fit's input,
:mod:`mla_lab.model.comm`), :data:`COMPARE_COLUMNS` (:func:`compare`, %); :func:`summary_table` per case over ranks.
NVLink multicast stays off (:data:`SAFE_ENV`). CPU run: ``tests/test_measure_tp.py``; GPU run:
``mla_lab/measure/experiments/tp_block.py``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..arch import get_arch
from ..buffers import MIB, padded_num_heads
from ..kernels import last_backend
from ..model.calibration import Calibration, default_calibration
from ..model.timing import comm_time_ms
from ..placement import Strategy, expand
from ..provenance import PROVENANCE_COLUMNS, provenance
from ..strategies import PaddedQPath
from .attention import call_peak_bytes, sm_scale
from .layer_runs import measured_rank
from .timer import call_ms, quantile
from .tp_blocks import (
    BF16_BYTES,
    BLOCKS,
    MOE_IMPLS,
    _check_moe_split,
    _model,
    block_forward,
    make_block_inputs,
    make_moe_inputs,
    moe_forward,
    moe_routing,
    resolve_moe_impl,
)

#: NVLink multicast off (NCCL NVLS, torch symmetric-memory multicast, NVSHMEM NVLS): shared machines.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RUNS = ("tp", "sim")

#: Columns of a block row (then :data:`COMPARE_COLUMNS`, then :data:`mla_lab.provenance.PROVENANCE_COLUMNS`).
BLOCK_COLUMNS = [
    "run", "rank", "world_size", "device_index", "dist_backend", "model", "tp", "T", "block", "strategy", "content",
    "num_heads", "padded_heads", "hidden_size", "v_head_dim", "topk", "n_routed_experts", "experts_per_rank",
    "num_experts_per_tok", "moe_intermediate_size", "shared_intermediate_per_rank", "routed_pairs", "arch",
    "nvlink_gbps", "workspace_bytes", *SAFE_ENV, "warmup", "iters", "attn_ms", "compute_ms", "block_ms",
    "block_ms_min", "block_ms_max", "allreduce_ms", "allreduce_bytes", "allreduce_model_ms", "kernel_backend",
    "concat_backend", "moe_impl", "allocated_bytes", "peak_extra_bytes", "device_used_bytes", "torch_reserved_bytes",
    "nccl_bytes", "untracked_growth_bytes",
]
_INT_COLUMNS = ("rank", "world_size", "device_index", "tp", "T", "num_heads", "padded_heads", "hidden_size",
                "v_head_dim", "topk", "n_routed_experts", "experts_per_rank", "num_experts_per_tok",
                "moe_intermediate_size", "shared_intermediate_per_rank", "routed_pairs", "workspace_bytes", "warmup",
                "iters", "allreduce_bytes", "allocated_bytes", "peak_extra_bytes", "device_used_bytes",
                "torch_reserved_bytes", "nccl_bytes", "untracked_growth_bytes")
#: Columns :func:`compare` adds to the block rows.
COMPARE_COLUMNS = ["sim_compute_ms", "sim_peak_extra_bytes", "sim_device_used_bytes", "time_error_pct",
                   "compute_error_pct", "allreduce_model_error_pct", "mem_error_pct", "device_used_diff_bytes"]
#: Columns of an all-reduce row (then :data:`mla_lab.provenance.PROVENANCE_COLUMNS`); ``T``, ``hidden_size``
#: empty for the bytes sweep. The comm-model fit reads these names.
ALLREDUCE_COLUMNS = ["world_size", "rank", "nbytes", "T", "hidden_size", "ms", "ms_min", "ms_max", "ms_p25",
                     "ms_p75", "iters", "warmup", "dist_backend", *SAFE_ENV]


@dataclass
class TPBenchmarkConfig:
    """What to run. ``models``: names (``data/models``); ``tokens``: block step sizes T (one causal prompt); ``tp``:
    processes of the tp run and the share the sim run simulates (``ep = tp`` for moe); ``blocks``, ``runs``: of
    :data:`BLOCKS`, :data:`RUNS`; ``strategies``: :func:`resolve_strategies` names; ``arch``: None is h200; ``device``:
    ``cuda`` (NCCL) or ``cpu`` (gloo, a dry run); ``moe_impl``: :data:`MOE_IMPLS`; ``model_overrides``:
    :func:`tiny_overrides` for CPU; ``save_outputs``: each rank's block output as ``.pt``; ``allreduce_tokens`` (with
    ``tokens``) / ``allreduce_mib``: the ``[T, hidden]`` and bytes (MiB) all-reduce rows."""

    models: list = field(default_factory=lambda: ["glm-5", "deepseek-v3.2"])
    tokens: list = field(default_factory=lambda: [4096, 16384])
    tp: int = 2
    blocks: list = field(default_factory=lambda: ["attention"])
    strategies: list = field(default_factory=lambda: ["per_call_empty:zeros", "private_workspace"])
    arch: str | None = None
    device: str = "cuda"
    warmup: int = 5
    iters: int = 20
    kernel_backend: str = "auto"
    concat_backend: str = "auto"
    moe_impl: str = "auto"
    seed: int = 0
    model_overrides: dict = field(default_factory=dict)
    save_outputs: bool = False
    runs: list = field(default_factory=lambda: ["tp", "sim"])
    allreduce_tokens: list = field(default_factory=lambda: [1024, 4096, 16384])
    allreduce_mib: list = field(default_factory=lambda: [1, 4, 16, 64, 256])


@dataclass
class TPBenchmarkResult:
    """DataFrames: ``blocks`` (:data:`BLOCK_COLUMNS` + :data:`COMPARE_COLUMNS` + provenance, a row per rank) and
    ``allreduce`` (:data:`ALLREDUCE_COLUMNS` + provenance; empty without a tp run)."""

    blocks: object
    allreduce: object


def ideal_ring_calibration() -> Calibration:
    """The committed calibration with the ideal ring (``comm_efficiency`` 1, ``comm_latency_us`` 0): the
    ``allreduce_model_ms`` column, ``2 (tp-1)/tp x T x hidden x 2`` bytes over ``nvlink_gbps / 2`` GB/s, a lower
    bound."""
    return default_calibration().with_comm(comm_efficiency=1.0, comm_latency_us=0.0)


def resolve_strategies(names) -> list[Strategy]:
    """Strategy names (as :func:`mla_lab.placement.expand` reads them: names, presets, aliases) or objects ->
    the padded :class:`~mla_lab.placement.Strategy` s to run, duplicates dropped, order kept.

    Raises:
        ValueError: ``kernel_native`` / ``kernel-native`` (modelled only) or an unknown name (says what is allowed).
    """
    out = []
    for name in names:
        for strategy in expand([name]):
            if not strategy.padded:
                raise ValueError(f"strategies holds {name!r}: {strategy.name} is modelled only (no padded Q to run "
                                 "on tensors); allowed: the other canonical names, presets, unfused / fused, "
                                 "subchunk:<S>")
            out.append(strategy)
    return list(dict.fromkeys(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync(device: str, world_size: int) -> None:
    if world_size > 1:
        dist.barrier()
    if device == "cuda":
        torch.cuda.synchronize()


def _barrier_times_ms(fn, device: str, world_size: int, warmup: int, iters: int) -> list[float]:
    """``iters`` ms after ``warmup`` calls, each call after a barrier of all ranks (:func:`.timer.call_ms`)."""
    for _ in range(warmup):
        fn()
    _sync(device, world_size)
    times = []
    for _ in range(iters):
        _sync(device, world_size)
        times.append(call_ms(fn, device))
    return times


def _untracked(device: str):
    """``total - free - memory_reserved`` bytes (CUDA), or None."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def _worker(rank: int, world_size: int, run: str, cfg: TPBenchmarkConfig, out_dir: str, port: int) -> None:
    """One process: rank ``rank`` of ``world_size`` (``run="tp"``) or the simulation (``run="sim"``), on GPU
    ``rank``."""
    os.environ.update(SAFE_ENV)  # before any process group / NCCL communicator exists
    device = dev = cfg.device
    base = None
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = f"cuda:{rank}"
        torch.zeros(1, device=dev)  # the CUDA context exists from here
        base = _untracked(device)
    backend = None
    if world_size > 1:
        backend = "nccl" if device == "cuda" else "gloo"
        kw = {"device_id": torch.device(dev)} if device == "cuda" else {}
        dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}", **kw)
        dist.barrier()
        dist.all_reduce(torch.zeros(MIB // BF16_BYTES, device=dev, dtype=torch.bfloat16))  # the first collectives
        _sync(device, world_size)
    after = _untracked(device)
    ctx = {"rank": rank, "world_size": world_size, "run": run, "device": device, "dev": dev, "backend": backend,
           "device_index": rank if device == "cuda" else None, "base_untracked": base,
           "nccl_bytes": None if base is None else after - base, "arch": get_arch(cfg.arch or "h200"),
           "calibration": ideal_ring_calibration()}
    rows, ar_rows = [], []

    def dump():
        (Path(out_dir) / f"rows_{run}_r{rank}.json").write_text(json.dumps(rows))
        (Path(out_dir) / f"allreduce_{run}_r{rank}.json").write_text(json.dumps(ar_rows))

    try:
        ar_ms = _worker_allreduce(cfg, ctx, ar_rows) if world_size > 1 else {}
        _worker_cases(cfg, ctx, out_dir, ar_ms, rows)
    finally:  # no barrier before: on a failure the other ranks may sit in a collective (mp.spawn ends them)
        dump()
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


def _allreduce_row(ctx, cfg, nbytes, T, hidden, times) -> dict:
    return {"world_size": ctx["world_size"], "rank": ctx["rank"], "nbytes": nbytes, "T": T, "hidden_size": hidden,
            "ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
            "ms_p25": quantile(times, 0.25), "ms_p75": quantile(times, 0.75), "iters": cfg.iters,
            "warmup": cfg.warmup, "dist_backend": ctx["backend"], **{k: os.environ.get(k, "") for k in SAFE_ENV}}


def _worker_allreduce(cfg, ctx, ar_rows) -> dict:
    """The all-reduce alone: the bytes sweep, then ``[T, hidden]`` per T and hidden size; ``{(T, hidden): ms}``."""
    device, dev, ws = ctx["device"], ctx["dev"], ctx["world_size"]

    def timed(numel):
        buf = torch.zeros(numel, device=dev, dtype=torch.bfloat16)
        return _barrier_times_ms(lambda: dist.all_reduce(buf), device, ws, cfg.warmup, cfg.iters)

    for mib in cfg.allreduce_mib:
        nbytes = int(round(mib * MIB)) // BF16_BYTES * BF16_BYTES
        ar_rows.append(_allreduce_row(ctx, cfg, nbytes, None, None, timed(nbytes // BF16_BYTES)))
    hiddens = list(dict.fromkeys(_model(m, cfg.model_overrides).hidden_size for m in cfg.models))
    out = {}
    for hidden in hiddens:
        for T in sorted(set(cfg.allreduce_tokens) | set(cfg.tokens)):
            times = timed(T * hidden)
            ar_rows.append(_allreduce_row(ctx, cfg, T * hidden * BF16_BYTES, T, hidden, times))
            out[(T, hidden)] = statistics.median(times)
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _worker_cases(cfg, ctx, out_dir, ar_ms, rows) -> None:
    """Every (model, T, block, strategy) of ``cfg`` on this rank, appended to ``rows``."""
    device, dev, rank, ws = ctx["device"], ctx["dev"], ctx["rank"], ctx["world_size"]
    strategies = resolve_strategies(cfg.strategies)
    for name in cfg.models:
        model = _model(name, cfg.model_overrides)
        view = measured_rank(model, cfg.tp, cfg.arch or "h200", ("ep", cfg.tp))  # experts split EP = TP
        for T in cfg.tokens:
            for block in cfg.blocks:
                make, cases = (make_block_inputs, strategies) if block == "attention" else (make_moe_inputs, [None])
                inp = make(view, rank, T, cfg.seed, dev)
                for s in cases:
                    row = _measure_case(block, s, model, name, T, inp, cfg, ctx, out_dir)
                    row["allreduce_ms"] = ar_ms.get((T, model.hidden_size))
                    rows.append(row)
                    _sync(device, ws)
                del inp
                if device == "cuda":
                    torch.cuda.empty_cache()


def _measure_case(block, strategy: Strategy | None, model, name, T, inp, cfg, ctx, out_dir) -> dict:
    device, dev, rank, ws, arch = ctx["device"], ctx["dev"], ctx["rank"], ctx["world_size"], ctx["arch"]
    row = {c: None for c in BLOCK_COLUMNS}
    row.update({"run": ctx["run"], "rank": rank, "world_size": ws, "device_index": ctx["device_index"],
                "dist_backend": ctx["backend"] or "none", "model": name, "tp": cfg.tp, "T": T, "block": block,
                "strategy": strategy.name if strategy else "none", "content": strategy.content if strategy else "",
                "hidden_size": model.hidden_size, "arch": arch.name, "nvlink_gbps": arch.nvlink_gbps,
                "warmup": cfg.warmup, "iters": cfg.iters, "nccl_bytes": ctx["nccl_bytes"],
                **{k: os.environ.get(k, "") for k in SAFE_ENV}})
    if block == "attention":
        H = inp["num_heads"]
        sm = sm_scale(model)
        strat = PaddedQPath(strategy, num_heads=H, max_num_batched_tokens=T, arch=arch.name, device=dev,
                            kernel_backend=cfg.kernel_backend, concat_backend=cfg.concat_backend,
                            reuse_pad_block=True)  # a pad block filled once, as mla_lab.measure.attention times it
        row.update(num_heads=H, padded_heads=padded_num_heads(H, arch.name, "bf16"), v_head_dim=model.v_head_dim,
                   topk=model.topk, workspace_bytes=strat.workspace.nbytes)

        def fn(parts="block"):
            return block_forward(strat, inp, sm, ws, parts)
        parts_timed = ("attn", "compute", "block")
    else:
        E = model.n_routed_experts
        row.update(n_routed_experts=E, experts_per_rank=inp["num_local_experts"],
                   num_experts_per_tok=model.num_experts_per_tok, moe_intermediate_size=model.moe_intermediate_size,
                   shared_intermediate_per_rank=inp["w_sh13"].shape[0] // 2,
                   routed_pairs=int(moe_routing(inp)[0].numel()), moe_impl=resolve_moe_impl(cfg.moe_impl, dev))

        def fn(parts="block"):
            return moe_forward(inp, ws, parts, row["moe_impl"])
        parts_timed = ("compute", "block")
    y = fn()  # first call (JIT compile, allocator warm-up)
    if cfg.save_outputs:
        torch.save(y.cpu(), Path(out_dir) / f"y_{ctx['run']}_{block}_{name}_{T}_{row['strategy']}_r{rank}.pt")
    del y
    for parts in parts_timed if ws > 1 else [p for p in parts_timed if p != "block"]:
        times = _barrier_times_ms(lambda p=parts: fn(p), device, ws, cfg.warmup, cfg.iters)
        row[f"{parts}_ms"] = statistics.median(times)
        if parts == "block" or (ws == 1 and parts == "compute"):
            row["block_ms_min"], row["block_ms_max"] = min(times), max(times)
    if ws == 1:  # nothing to reduce: the simulation's block is its compute
        row["block_ms"] = row["compute_ms"]
    row["allreduce_bytes"] = T * model.hidden_size * BF16_BYTES
    row["allreduce_model_ms"] = comm_time_ms("allreduce", row["allreduce_bytes"], cfg.tp, arch, ctx["calibration"])
    if block == "attention":
        row["kernel_backend"] = str(last_backend("sparse_mla_prefill"))
        row["concat_backend"] = str(last_backend("concat_mla_q"))
    row.update(_memory(device, ws, fn, ctx["base_untracked"]))
    return row


def _memory(device: str, world_size: int, fn, base) -> dict:
    """Allocated bytes before a call, its peak on top (:func:`.attention.call_peak_bytes`), used / reserved bytes
    after it, the growth of what torch does not hold (CUDA; None on CPU)."""
    keys = ("allocated_bytes", "peak_extra_bytes", "device_used_bytes", "torch_reserved_bytes",
            "untracked_growth_bytes")
    if device != "cuda":
        return dict.fromkeys(keys)
    _sync(device, world_size)
    before = torch.cuda.memory_allocated()
    peak = call_peak_bytes(fn)
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    growth = None if base is None else total - free - reserved - base
    return dict(zip(keys, (before, peak, total - free, reserved, growth)))


def check_config(cfg: TPBenchmarkConfig) -> None:
    """Refuse a config before any process is spawned.

    Raises:
        ValueError: an unknown name; ``tp`` not a positive int, below 2 with a tp run or not dividing the model;
            bad warmup / iters / tokens / all-reduce sizes.
        RuntimeError: ``device="cuda"`` with fewer than ``tp`` GPUs for a tp run, or none.
    """
    _check_names(cfg)
    _check_sizes(cfg)
    if "attention" in cfg.blocks:
        resolve_strategies(cfg.strategies)
    for m in cfg.models:
        model = _model(m, cfg.model_overrides)
        if "attention" in cfg.blocks:
            model.heads_per_rank(cfg.tp)
        if "moe" in cfg.blocks:
            _check_moe_split(model, cfg.tp)
    n = torch.cuda.device_count() if cfg.device == "cuda" else None
    if n is not None and "tp" in cfg.runs and n < cfg.tp:
        raise RuntimeError(f"tp={cfg.tp} needs {cfg.tp} GPUs; torch sees {n} (runs=['sim'] needs one)")
    if n is not None and n < 1:
        raise RuntimeError("device='cuda' needs a GPU; torch sees 0")


def _check_names(cfg: TPBenchmarkConfig) -> None:
    """Blocks, runs, device and moe_impl among the allowed values."""
    for what, values, allowed in (("blocks", cfg.blocks, BLOCKS), ("runs", cfg.runs, RUNS)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ValueError(f"{what} holds {bad[0]!r}; allowed: {list(allowed)}" if bad
                             else f"{what} is empty; allowed: {list(allowed)}")
    if cfg.device not in ("cuda", "cpu"):
        raise ValueError(f"device={cfg.device!r}; allowed: ['cuda', 'cpu']")
    if cfg.moe_impl not in MOE_IMPLS:
        raise ValueError(f"moe_impl={cfg.moe_impl!r}; allowed: {list(MOE_IMPLS)}")
    if cfg.moe_impl == "grouped_mm" and cfg.device != "cuda":
        raise ValueError("moe_impl='grouped_mm' needs device='cuda' (torch._grouped_mm on sm90+); allowed on "
                         "cpu: ['auto', 'loop']")


def _is_int(v, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _check_sizes(cfg: TPBenchmarkConfig) -> None:
    """tp, warmup, iters, tokens and all-reduce sizes in range."""
    if not _is_int(cfg.tp, 1):
        raise ValueError(f"tp={cfg.tp!r} must be a positive int")
    if "tp" in cfg.runs and cfg.tp < 2:
        raise ValueError(f"tp={cfg.tp} with runs holding 'tp': nothing to shard (use runs=['sim'])")
    for name, v, lo in (("warmup", cfg.warmup, 0), ("iters", cfg.iters, 1)):
        if not _is_int(v, lo):
            raise ValueError(f"{name}={v!r} must be an int >= {lo}")
    bad = [T for T in [*cfg.tokens, *cfg.allreduce_tokens] if not _is_int(T, 1)]
    if bad:
        raise ValueError(f"tokens / allreduce_tokens hold {bad[0]!r}; each must be a positive int")
    bad = [m for m in cfg.allreduce_mib if isinstance(m, bool) or not isinstance(m, (int, float))
           or not m * MIB >= BF16_BYTES]
    if bad:
        raise ValueError(f"allreduce_mib holds {bad[0]!r}; each must be a number of MiB >= {BF16_BYTES / MIB}")


def run_tp_benchmark(cfg: TPBenchmarkConfig, out_dir: str | Path | None = None) -> TPBenchmarkResult:
    """Spawn the tp run (``cfg.tp`` processes) and/or the sim run (one, GPU 0); ``out_dir``: where workers leave
    their rows (default a temp dir). Rows get ``provenance("measured")`` and the :func:`compare` columns.

    Raises:
        ValueError, RuntimeError: as :func:`check_config`, or a worker's exception (``mp.spawn``).
    """
    import pandas as pd
    import torch.multiprocessing as mp

    check_config(cfg)
    os.environ.update(SAFE_ENV)  # inherited by the spawned workers
    with tempfile.TemporaryDirectory(prefix="tp_check_") as tmp:
        work = Path(out_dir) if out_dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "tp" in cfg.runs:
            mp.spawn(_worker, args=(cfg.tp, "tp", cfg, str(work), _free_port()), nprocs=cfg.tp, join=True)
        if "sim" in cfg.runs:
            mp.spawn(_worker, args=(1, "sim", cfg, str(work), _free_port()), nprocs=1, join=True)
        rows, ar_rows = ([r for f in sorted(work.glob(pattern)) for r in json.loads(f.read_text())]
                         for pattern in ("rows_*.json", "allreduce_*.json"))
    prov = provenance("measured")
    if cfg.device == "cpu":  # a dry run of the logic: say where it ran
        prov.update(device="cpu", sm="none", driver="none", cuda="none")
    blocks = pd.DataFrame(rows, columns=BLOCK_COLUMNS)
    allreduce = pd.DataFrame(ar_rows, columns=ALLREDUCE_COLUMNS)
    for df, cols in ((blocks, _INT_COLUMNS), (allreduce, ("world_size", "rank", "nbytes", "T", "hidden_size",
                                                           "iters", "warmup"))):
        for c in cols:  # ints with gaps (moe rows have no heads, the bytes sweep no T) stay ints, not floats
            df[c] = pd.to_numeric(df[c]).astype("Int64")
    blocks = compare(blocks)
    for df in (blocks, allreduce):
        for k in PROVENANCE_COLUMNS:
            df[k] = prov.get(k, "none")
    return TPBenchmarkResult(blocks=blocks, allreduce=allreduce)


def compare(df):
    """``df`` with :data:`COMPARE_COLUMNS` on its tp rows (sim rows NaN), every rank kept: the sim row of the same
    (tp, model, T, block, strategy; keys ``df`` lacks, as the TP=2 file written before blocks, left out), errors
    in %, ``device_used_diff_bytes`` tp - sim (NCCL's buffers and what the allocator does not see)."""
    import numpy as np
    import pandas as pd

    df = df.copy()
    keys = [k for k in ("tp", "model", "T", "block", "strategy") if k in df.columns]
    sim_cols = {"compute_ms": "sim_compute_ms", "peak_extra_bytes": "sim_peak_extra_bytes",
                "device_used_bytes": "sim_device_used_bytes"}
    sim = df[df["run"] == "sim"][keys + list(sim_cols)].rename(columns=sim_cols).drop_duplicates(keys)
    df = df.drop(columns=[c for c in COMPARE_COLUMNS if c in df])
    out = df.merge(sim, on=keys, how="left")
    tp = out["run"] == "tp"

    def num(c):
        return pd.to_numeric(out[c], errors="coerce") if c in out else pd.Series(np.nan, index=out.index)

    def pct(a, b):
        return (100.0 * (a - b) / b).where(tp & (b > 0))

    out["time_error_pct"] = pct(num("sim_compute_ms") + num("allreduce_model_ms"), num("block_ms"))
    out["compute_error_pct"] = pct(num("sim_compute_ms"), num("compute_ms"))
    out["allreduce_model_error_pct"] = pct(num("allreduce_model_ms"), num("allreduce_ms"))
    out["mem_error_pct"] = pct(num("sim_peak_extra_bytes"), num("peak_extra_bytes"))
    out["device_used_diff_bytes"] = (num("device_used_bytes") - num("sim_device_used_bytes")).where(tp)
    for c in sim_cols.values():
        out[c] = num(c).where(tp, np.nan)
    return out


def summary_table(df):
    """A line per (world_size, model, T, block, strategy) of the tp run, over ranks: block / compute / all-reduce
    ms, the slowest rank, sim + modelled all-reduce and its error against the slowest rank, peak and NCCL MiB,
    routed pairs (moe). ms, MiB, %; empty without tp rows."""
    import pandas as pd

    if "block" not in df:
        df = df.assign(block="attention")
    if "world_size" not in df:
        df = df.assign(world_size=df["tp"])
    tp = df[df["run"] == "tp"].copy()
    if tp.empty:
        return pd.DataFrame()
    for c in ("block_ms", "compute_ms", "allreduce_ms", "peak_extra_bytes", "sim_peak_extra_bytes", "nccl_bytes",
              "routed_pairs", "num_heads", "experts_per_rank", "sim_compute_ms", "allreduce_model_ms"):
        tp[c] = pd.to_numeric(tp[c], errors="coerce") if c in tp else float("nan")
    keys = ["world_size", "model", "T", "block", "strategy"]
    g = tp.groupby(keys, sort=False, dropna=False)
    t = g.agg(ranks=("rank", "nunique"), **{"heads/rank": ("num_heads", "first"),
                                            "experts/rank": ("experts_per_rank", "first")},
              **{f"{c}_{f}": (c, f) for c in ("block_ms", "compute_ms") for f in ("min", "median", "max")},
              allreduce_ms_median=("allreduce_ms", "median"), allreduce_ms_max=("allreduce_ms", "max"),
              sim_compute_ms=("sim_compute_ms", "first"), model_allreduce_ms=("allreduce_model_ms", "first"))
    t.insert(6, "slowest_rank", tp.loc[g["block_ms"].idxmax(), keys + ["rank"]].set_index(keys)["rank"])
    t["sim+model_ms"] = t["sim_compute_ms"] + t["model_allreduce_ms"]
    t["time_err_%"] = 100 * (t["sim+model_ms"] - t["block_ms_max"]) / t["block_ms_max"]
    t["compute_err_%"] = 100 * (t["sim_compute_ms"] - t["compute_ms_max"]) / t["compute_ms_max"]
    peak, sim_peak = g["peak_extra_bytes"].max(), g["sim_peak_extra_bytes"].first()
    t["tp_peak_MiB"], t["sim_peak_MiB"] = peak / MIB, sim_peak / MIB
    t["mem_err_%"] = 100 * (sim_peak - peak) / peak
    t["nccl_MiB"] = g["nccl_bytes"].max() / MIB
    t["routed_pairs_min"], t["routed_pairs_max"] = g["routed_pairs"].min(), g["routed_pairs"].max()
    return t.reset_index()
