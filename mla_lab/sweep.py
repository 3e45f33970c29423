"""The padding sweep: grid of (model, TP, arch, max_num_batched_tokens, prompt_len, kv_cache_dtype) points, each
priced for every strategy (memory exact; TTFT modelled, or measured on a GPU), stored point by point.

The notebook ``notebooks/padding_sweep.ipynb`` is the front door; everything it does lives here.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .arch import detect_arch, get_arch  # noqa: F401 (detect_arch: looked up here by executors.LocalExecutor)
from .buffers import MIB, STRATEGIES, kv_tokens_lost, memory_account
from .models import load_model, normalize_kv_cache_dtype
from .provenance import provenance
from .store import ResultStore, code_version, point_key
from .workload import Workload

__all__ = ["SweepParams", "expand_grid", "run_sweep", "price_point", "equivalence_check", "DEFAULTS",
           "validate_params"]

REPO = Path(__file__).resolve().parent.parent


@dataclass
class SweepParams:
    """Sweep parameters (the notebook's ``parameters`` cell holds the same names).

    Attributes:
        models: model names under ``data/models`` (``glm-5``, ``deepseek-v3.2``).
        tp_sizes: TP sizes; each must divide every model's num_attention_heads (else the point fails, recorded).
        archs: arch names or aliases (``h200``, ``b200``, ``hopper``, ``blackwell``...).
        max_num_batched_tokens: chunk sizes (vLLM ``--max-num-batched-tokens``), also the workspace rows.
        prompt_lens: prompt lengths in tokens.
        kv_cache_dtype: ``bf16`` or ``fp8`` (or a list of both).
        num_prompts, concurrency: the workload (default: the PR's 32 prompts at concurrency 32).
        strategies: subset of ``unfused``, ``fused``, ``kernel_native`` (``unfused`` always priced: the baseline).
        device: ``auto`` (GPU if torch sees one, else CPU), ``cpu`` (modelled only) or ``cuda`` (measure; error if no
            GPU). Measured rows are produced only for archs whose family matches the running GPU.
        store_dir: where point files go; data_file: the tidy CSV written at the end; report_dir: charts.
        check_equivalence: run fused and unfused on small CPU shapes and compare outputs.
        force: recompute points already stored.
        executor: ``local`` (points in this process, the default) or ``ray`` (points as Ray tasks:
            :mod:`mla_lab.executors`; needs the ``ray`` extra).
        ray_address: Ray cluster to join with ``executor="ray"`` (``auto``, ``host:6379``, ``ray://host:10001``);
            null starts a local Ray instance.
        weight_dtype: ``fp8`` (default: the PR ran GLM-5.2-FP8, and DeepSeek-V3.2 ships fp8 weights) or ``bf16``;
            moe_parallel: ``ep`` (default: expert parallelism over the TP ranks, vLLM ``-ep`` as in the PR) or
            ``tp`` (every expert sharded over TP). Both enter the TTFT model (:mod:`mla_lab.layer_model`) and the
            KV-capacity columns; bf16 weights of these models do not fit an H200 at TP <= 8.
    """

    models: list = field(default_factory=lambda: ["glm-5", "deepseek-v3.2"])
    tp_sizes: list = field(default_factory=lambda: [1, 2, 4, 8])
    archs: list = field(default_factory=lambda: ["h200", "b200"])
    max_num_batched_tokens: list = field(default_factory=lambda: [8192, 16384])
    prompt_lens: list = field(default_factory=lambda: [1024, 8192])
    kv_cache_dtype: object = "bf16"
    num_prompts: int = 32
    concurrency: int | None = None
    strategies: list = field(default_factory=lambda: list(STRATEGIES))
    device: str = "auto"
    store_dir: str = "data/sweeps/padding_sweep"
    data_file: str = "data/padding_sweep.csv"
    report_dir: str = "reports"
    check_equivalence: bool = True
    force: bool = False
    executor: str = "local"
    ray_address: str | None = None
    weight_dtype: str = "fp8"
    moe_parallel: str = "ep"


DEFAULTS = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
            for f in dataclasses.fields(SweepParams)}
_LIST_INT = ("tp_sizes", "max_num_batched_tokens", "prompt_lens")
_LIST_STR = ("models", "archs", "strategies")


def validate_params(raw: dict) -> SweepParams:
    """Check names and types of sweep parameters (from YAML, ``-p`` pairs or the notebook) and build
    :class:`SweepParams`.

    Raises:
        ValueError: an unknown key (lists the allowed ones), a wrong type, an empty list (an empty grid), or a value
            the lab does not know (unknown model/arch/strategy/dtype/device), each naming the key and the value.
    """
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown sweep parameter(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    p = dict(DEFAULTS)
    p.update(raw)
    for k in _LIST_INT + _LIST_STR:
        v = p[k]
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"{k}={v!r} must be a list")
        if not v:
            raise ValueError(f"{k}=[] gives an empty grid; give at least one value")
        want = int if k in _LIST_INT else str
        for x in v:
            if isinstance(x, bool) or not isinstance(x, want):
                raise ValueError(f"{k} holds {x!r} ({type(x).__name__}); every entry must be {want.__name__}")
            if want is int and x <= 0:
                raise ValueError(f"{k} holds {x!r}; every entry must be a positive int")
        p[k] = list(v)
    kv = p["kv_cache_dtype"]
    kv = [kv] if isinstance(kv, str) else kv
    if not isinstance(kv, (list, tuple)) or not kv:
        raise ValueError(f"kv_cache_dtype={p['kv_cache_dtype']!r} must be 'bf16', 'fp8' or a non-empty list of them")
    p["kv_cache_dtype"] = [normalize_kv_cache_dtype(x) for x in kv]
    for m in p["models"]:
        load_model(m)
    for a in p["archs"]:
        get_arch(a)
    for s in p["strategies"]:
        if s not in STRATEGIES:
            raise ValueError(f"strategies holds {s!r}; allowed: {list(STRATEGIES)}")
    for k in ("num_prompts",):
        if isinstance(p[k], bool) or not isinstance(p[k], int) or p[k] <= 0:
            raise ValueError(f"{k}={p[k]!r} must be a positive int")
    if p["concurrency"] is not None and (isinstance(p["concurrency"], bool) or not isinstance(p["concurrency"], int)
                                         or p["concurrency"] <= 0):
        raise ValueError(f"concurrency={p['concurrency']!r} must be a positive int or null")
    if p["device"] not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device={p['device']!r} is not allowed; allowed: ['auto', 'cpu', 'cuda']")
    for k in ("store_dir", "data_file", "report_dir"):
        if not isinstance(p[k], str) or not p[k]:
            raise ValueError(f"{k}={p[k]!r} must be a non-empty path string")
    for k in ("check_equivalence", "force"):
        if not isinstance(p[k], bool):
            raise ValueError(f"{k}={p[k]!r} must be true or false")
    for k, allowed in (("weight_dtype", ("fp8", "bf16")), ("moe_parallel", ("ep", "tp"))):
        if p[k] not in allowed:
            raise ValueError(f"{k}={p[k]!r} is not allowed; allowed: {list(allowed)}")
    _validate_executor(p)
    return SweepParams(**p)


def _validate_executor(p: dict) -> None:
    from .executors import EXECUTORS, RAY_INSTALL_HINT, ray_available

    if p["executor"] not in EXECUTORS:
        raise ValueError(f"executor={p['executor']!r} is not allowed; allowed: {list(EXECUTORS)}")
    addr = p["ray_address"]
    if addr is not None and (not isinstance(addr, str) or not addr.strip()):
        raise ValueError(f"ray_address={addr!r} must be a Ray address string (auto, host:6379, ray://host:10001) "
                         "or null")
    if addr is not None and p["executor"] != "ray":
        raise ValueError(f"ray_address={addr!r} is only used with executor='ray' (executor={p['executor']!r})")
    if p["executor"] == "ray" and not ray_available():
        raise ValueError(f"executor='ray' needs the optional ray package, which is not installed here; install it "
                         f"with {RAY_INSTALL_HINT}")


def expand_grid(params: SweepParams) -> list[dict]:
    """Every grid point as a dict (canonical names: arch resolved to its card)."""
    pts = []
    for m, tp, a, mbt, L, kv in itertools.product(params.models, params.tp_sizes, params.archs,
                                                   params.max_num_batched_tokens, params.prompt_lens,
                                                   params.kv_cache_dtype):
        pts.append({"model": m, "tp": tp, "arch": get_arch(a).name, "max_num_batched_tokens": mbt,
                    "prompt_len": L, "kv_cache_dtype": kv, "num_prompts": params.num_prompts,
                    "concurrency": params.concurrency or params.num_prompts,
                    "weight_dtype": params.weight_dtype, "moe_parallel": params.moe_parallel,
                    "strategies": list(params.strategies)})
    # de-duplicate (aliases may map two names to one card)
    seen, out = set(), []
    for p in pts:
        k = point_key(p, "")
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out


def memory_columns(point: dict, strategy: str) -> dict:
    """The columns every sweep row has, modelled or measured: the point's parameters, the strategy, heads per rank
    and the exact byte accounting (:func:`mla_lab.buffers.memory_account`), the extra persistent workspace against
    ``unfused`` in bytes, MiB and KV-cache tokens lost per rank.

    Raises:
        ValueError: as the model/arch/padding functions (e.g. tp not dividing the heads).
    """
    model = load_model(point["model"])
    arch = get_arch(point["arch"])
    H = model.heads_per_rank(point["tp"])
    mbt, kv = point["max_num_batched_tokens"], point["kv_cache_dtype"]
    mem = memory_account(strategy, H, mbt, arch, kv, head_size=model.head_size, d_v=model.d_v)
    base = memory_account("unfused", H, mbt, arch, kv, head_size=model.head_size, d_v=model.d_v)
    extra = mem.persistent_bytes - base.persistent_bytes
    row = {k: v for k, v in point.items() if k not in ("strategies", "mode")}
    row.update(
        strategy=strategy, family=arch.family, sm=arch.sm, prefill_padding=arch.prefill_padding, num_heads=H,
        q_concat_heads=mem.q_concat_heads, kernel_heads=mem.kernel_heads,
        persistent_bytes=mem.persistent_bytes, step_transient_bytes=mem.step_transient_bytes,
        kernel_out_bytes=mem.kernel_out_bytes, peak_bytes=mem.peak_bytes,
        extra_persistent_bytes=extra, extra_persistent_mib=extra / MIB,
        kv_tokens_lost=kv_tokens_lost(extra, model, kv), model_arch=arch.name, status="ok", reason="",
    )
    return row


def layer_kw(point: dict) -> dict:
    """The TTFT model's layer options of a point (weight dtype, MoE parallelism; defaults of :class:`SweepParams`
    for points stored before these existed)."""
    return {"weight_dtype": point.get("weight_dtype") or DEFAULTS["weight_dtype"],
            "moe_parallel": point.get("moe_parallel") or DEFAULTS["moe_parallel"]}


def add_ttft_change(rows: list[dict]) -> list[dict]:
    """Set ``ttft_change_pct`` of every row against the point's ``unfused`` row (in place; returns ``rows``)."""
    base = next(r["ttft_ms"] for r in rows if r["strategy"] == "unfused")
    for r in rows:
        r["ttft_change_pct"] = 100.0 * (r["ttft_ms"] - base) / base
    return rows


def price_point(point: dict, calibration=None) -> list[dict]:
    """Modelled rows (one per strategy) for one grid point: exact memory, modelled TTFT.

    Raises:
        ValueError: as the model/arch/padding functions (e.g. tp not dividing the heads).
    """
    from .ttft import memory_tradeoff, predict_ttft

    model = load_model(point["model"])
    arch = get_arch(point["arch"])
    wl = Workload(point["prompt_len"], point["num_prompts"], point["concurrency"])
    strategies = list(dict.fromkeys(["unfused"] + list(point["strategies"])))
    mbt, kv = point["max_num_batched_tokens"], point["kv_cache_dtype"]
    prov = provenance("modelled")
    kw = layer_kw(point)
    cap = memory_tradeoff(model, point["tp"], arch, mbt, kv, **kw)
    rows = []
    for s in strategies:
        t = predict_ttft(model, point["tp"], arch, wl, mbt, s, kv, calibration, **kw)
        row = memory_columns(point, s)
        row.update(
            ttft_ms=t["ttft_ms_mean"], ttft_ms_max=t["ttft_ms_max"], num_steps=t["num_steps"],
            ttft_scope=t["scope"],
            **{f"{op}_ms": t["ops_ms"].get(op, 0.0) for op in ("concat", "pad", "kernel", "out_slice")},
            calibration=t.get("calibration") or getattr(calibration, "name", None) or _default_cal_name(),
            kv_capacity_tokens=cap["kv_capacity_tokens"],
            kv_capacity_pct_lost=cap["strategies"][s]["kv_capacity_pct_lost"],
            weights_bytes_per_rank=cap["weights_bytes"], fits_in_memory=bool(cap["fits"]),
        )
        row.update(prov)
        rows.append(row)
    return add_ttft_change(rows)


def _default_cal_name() -> str:
    from .costmodel import default_calibration

    return default_calibration().name


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU; use device='auto' or 'cpu'")
    return device


def run_sweep(params: SweepParams | dict, progress: bool = True, measure_fn=None, executor=None) -> "object":
    """Run (or resume) the sweep; returns a pandas DataFrame of every stored row of this grid.

    Each point is written atomically when it completes; points already stored with ``status="ok"`` for this code
    version are skipped unless ``params.force``. A point that raises is stored as ``status="failed"`` with the reason
    and the sweep goes on; a later run retries failed points (an OOM on a shared GPU may not recur). Progress (points
    done / total, elapsed, ETA) goes to stderr when ``progress``. ``measure_fn(point) -> rows`` adds measured rows on
    a GPU (default :func:`mla_lab.bench.measure_point`).

    Points run on ``params.executor`` (:mod:`mla_lab.executors`: ``local`` in this process, or ``ray`` tasks on
    ``params.ray_address``), or on ``executor`` when given (an executor object the caller owns and closes). Either
    way this process writes every point to the store as it completes (same keys, no duplicates, failures recorded).
    """
    from .executors import make_executor

    if isinstance(params, dict):
        params = validate_params(params)
    store = ResultStore(_abs(params.store_dir))
    own = executor is None
    ex = make_executor(params.executor, address=params.ray_address) if own else executor
    try:
        return _run_points(params, store, ex, progress, measure_fn)
    finally:
        if own:
            ex.close()


def _run_points(params: SweepParams, store: ResultStore, ex, progress: bool, measure_fn) -> "object":
    import pandas as pd

    from .executors import PointTask

    device = ex.resolve_device(params.device)
    gpu = ex.detect_gpu() if device == "cuda" else None
    version = code_version()
    tasks = []
    for pt in expand_grid(params):
        tasks.append((pt, "modelled"))
        if gpu and gpu["arch"] and get_arch(pt["arch"]).family == get_arch(gpu["arch"]).family:
            tasks.append((pt, "measured"))
    t0, done = time.time(), 0
    todo = [(pt, mode, point_key({**pt, "mode": mode}, version)) for pt, mode in tasks]
    store.clean_stale_tmp()  # writes cut short by a killed sweep (never visible as points)
    status = {k: store.status(k) for _, _, k in todo}
    skip = {k for k, st in status.items() if st == "ok" and not params.force}
    n_failed = sum(1 for k, st in status.items() if st == "failed" and not params.force)
    n_unreadable = sum(1 for k in status if status[k] is None and store.has(k))
    if progress:
        extra = (f", {n_failed} failed before (retried)" if n_failed else "") + \
                (f", {n_unreadable} unreadable (recomputed)" if n_unreadable else "")
        print(f"[mla-lab] {len(todo)} point(s), {len(skip)} already stored{extra}, code {version}, device {device}",
              file=sys.stderr, flush=True)
        if ex.name != "local":
            print(f"[mla-lab] executor {ex.describe()}", file=sys.stderr, flush=True)
    keys = [key for _, _, key in todo]
    run = [PointTask(pt, mode, key) for pt, mode, key in todo if key not in skip]
    # results arrive as points complete (grid order for local, completion order for ray); this process writes them
    for res in ex.run(run, measure_fn=measure_fn, driver_version=version):
        pt, mode, key = res.task.point, res.task.mode, res.task.key
        try:
            if res.error is not None:
                raise _PointError(res.error)
            rows = res.rows
            for r in rows:
                r["point_key"] = key
                r["code_version"] = version
            store.write(key, {**pt, "mode": mode}, rows)
        except Exception as e:  # recorded, not fatal: the sweep goes on
            reason = str(e) if isinstance(e, _PointError) else f"{type(e).__name__}: {e}"
            store.write(key, {**pt, "mode": mode, "source": mode, "code_version": version}, [], status="failed",
                        reason=reason)
            if progress:
                print(f"[mla-lab] point failed ({reason})", file=sys.stderr, flush=True)
        done += 1
        if progress:
            # ETA from the points computed in this run, over those still to compute (stored points are skipped)
            el = time.time() - t0
            left = len(todo) - len(skip) - done
            eta = el / done * left
            print(f"[mla-lab] {len(skip) + done}/{len(todo)} points  elapsed {el:.1f}s  ETA {eta:.1f}s",
                  file=sys.stderr, flush=True)
    df = pd.DataFrame(store.rows(keys))
    out = _abs(params.data_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(out)
    return df


class _PointError(Exception):
    """A point's own error as the executor reported it (``"<ExceptionType>: <message>"``)."""


def _abs(p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else Path.cwd() / path


def equivalence_check(num_heads: int = 8, arch: str = "hopper", num_tokens: int = 24, s_kv: int = 96,
                      topk: int = 32, seed: int = 0, device: str = "cpu") -> dict:
    """Run ``unfused`` and ``fused`` on the same random inputs (with invalid indices and causal topk_length) and
    compare their real-head outputs and lse. Padded heads of the fused workspace are poisoned with NaN first, so a
    leak from uninitialized heads would show.

    Returns ``{"num_heads", "padded_heads", "max_abs_diff_out", "max_abs_diff_lse", "equal"}`` (``equal`` is exact
    equality, NaN-aware for the +inf lse of empty rows).
    """
    import torch

    from .strategies import make_strategy

    g = torch.Generator(device="cpu").manual_seed(seed)
    T = num_tokens
    ql_nope = torch.randn(T, num_heads, 512, generator=g).to(torch.bfloat16).to(device)
    q_pe = torch.randn(T, num_heads, 64, generator=g).to(torch.bfloat16).to(device)
    kv = torch.randn(s_kv, 1, 576, generator=g).to(torch.bfloat16).to(device)
    idx = torch.randint(-1, s_kv + 8, (T, 1, topk), generator=g, dtype=torch.int32).to(device)
    idx[0] = -1  # a row with no valid index
    topk_length = torch.clamp(torch.arange(1, T + 1, dtype=torch.int32), max=topk).to(device)
    kw = dict(num_heads=num_heads, max_num_batched_tokens=T, arch=arch, device=device)
    unf = make_strategy("unfused", **kw)
    fus = make_strategy("fused", **kw)
    fus.workspace.buffer.fill_(float("nan"))
    sm_scale = 576 ** -0.5
    out_u, lse_u = unf(ql_nope, q_pe, kv, idx, sm_scale, topk_length)
    out_f, lse_f = fus(ql_nope, q_pe, kv, idx, sm_scale, topk_length)
    d_out = (out_u.float() - out_f.float()).abs().max().item()
    finite = torch.isfinite(lse_u)
    d_lse = (lse_u[finite] - lse_f[finite]).abs().max().item() if finite.any() else 0.0
    equal = bool(torch.equal(out_u, out_f) and torch.equal(torch.isinf(lse_u), torch.isinf(lse_f)) and d_lse == 0.0)
    return {"num_heads": num_heads, "padded_heads": fus.padded_heads, "max_abs_diff_out": d_out,
            "max_abs_diff_lse": d_lse, "equal": equal}
