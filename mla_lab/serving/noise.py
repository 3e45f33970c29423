"""Run-to-run noise of one ``vllm bench serve`` run (issue 20; **modelled**; docs/serving.md, "Run-to-run noise"): a
seeded Monte-Carlo over what varies between two runs of one build (:data:`COMPONENTS`: each one's default, status and
source; the measured ones from :func:`load_cold_start`), and the change between two builds. GPU times are priced once
per distinct step shape (:class:`CachedPricer`), the noise applied to the cached value."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..deployment import Deployment
from ..model.calibration import Calibration
from ..model.decode_calibration import DecodeCalibration
from ._checks import check_float, check_int
from .benchmark import async_scheduler, bench_of, serve_benchmark
from .client import BenchConfig, arrival_times
from .metrics import SERVE_METRICS
from .scheduler import SchedulerConfig
from .simulate import ServingResult, simulate
from .step import Step, StepPricer
from .step_pricer import CostModelPricer, step_key

#: The metrics ``vllm bench serve`` prints (its result-dict names) that the Monte-Carlo keeps.
METRICS = (*(k for k, _ in SERVE_METRICS[1:]), "mean_e2el_ms")

#: Every component of the absolute run: default, unit, status (cited / assumed / measured) and source.
COMPONENTS = {k: dict(zip(("value", "unit", "status", "source"), v)) for k, v in {
    "async_scheduling": (True, "bool", "cited",
        "vllm/config/scheduler.py `async_scheduling: bool | None = None`, set True by vllm/config/vllm.py "
        "unless an incompatible option is set (the PR's server sets none); EngineCore.step_with_batch_queue "
        "(vllm/v1/engine/core.py @ 00080ee1) schedules step N+1 right after submitting step N; vLLM PR #19970"),
    "cpu_step_ms": (2.0, "ms/step", "assumed",
        "assumed 2 ms, bracketed by cited figures: ~4 ms GPU bubble per decode step in vLLM v0 (vLLM RFC "
        "#6854), v0 output processing 3.4 ms per step at batch 32 on Llama-3-70B 4xH100 (RFC #6913), a whole "
        "V1 decode step of Llama-3.2-1B at 2.73 ms TPOT (vLLM PR #17866: an upper bound on V1's CPU time at "
        "small batch); hidden behind the GPU time under async scheduling"),
    "output_delay_ms": (1.0, "ms", "assumed",
        "assumed: detokenisation and SSE streaming of a step's 32 tokens in the API server process (off the "
        "engine's critical path in V1: vLLM V1 blog, 2025-01-24), plus the client's parsing"),
    "arrival_first_ms": (3.0, "ms", "assumed",
        "assumed: HTTP, request validation, tokenisation of the first prompt and the ZMQ hand-off"),
    "arrival_per_request_ms": (1.4, "ms/request", "cited",
        "vLLM PR #19334 (before its micro-batching): 100 concurrent /v1/completions of 10,000 tokens took "
        "1.338 s on one tokenizer thread (ThreadPoolExecutor(max_workers=1), quoted in vLLM issue #25301): "
        "1.34 ms per 1,000 tokens, 1.37 ms for a 1024-token prompt (a different tokenizer and host CPU). Not "
        "measured on the PR's server, and the single-run spread depends strongly on it: how the 32 prompts "
        "split over steps is decided by whether they all reach the engine core within the first step "
        "(benchmarks/predict_pr53878.py's arrival_sensitivity)"),
    "arrival_cv": (0.5, "1", "assumed",
        "assumed coefficient of variation of one request's service time in the API server"),
    "run_sigma": (0.00767, "1 (log sd)", "measured",
        "data/measured/h200/between_process/content_loop.csv, column step_ms, rows content == 'zeros' (a sustained "
        "78-layer loop of the seed step on one H200, the PR's workspace; benchmarks/round3.py --parts content, 5 "
        "fresh processes x 6 rounds): sd over processes of log(per-process median), the medians from "
        "mla_lab.measure.spread.between_process (779.9 .. 794.3 ms, median 790.3 ms). The benchmark's run is whole "
        "steps, so the whole step's spread is the per-run factor; the attention path timed alone varies more between "
        "processes (step_spread.csv gpu_ms, attention_path:private_workspace: log sd 0.035) and less inside the "
        "sustained loop (content_loop.csv attn_path_ms: 0.007); not used. One GPU's figure applied to all 8 ranks' "
        "steps, decode steps included (the 8 GPUs of a server are not measured)"),
    "step_sigma": (0.00398, "1 (log sd)", "measured",
        "data/measured/h200/between_process/content_loop.csv, column step_ms, rows content == 'zeros': median over "
        "the 5 processes of the sd of log(step_ms) over the process's 6 rounds (0.0016 .. 0.0067); the layer blocks "
        "timed alone spread more per call (step_spread.csv gpu_ms: attention_block 2.3 %, moe_block 0.8 % relative "
        "sd, median over processes), which a 78-layer step averages out"),
    "cold_extra_ms": (0.00254, "ms", "measured",
        "data/measured/h200/between_process/cold_start.csv, columns wall_ms - steady_wall_ms at call == 2, "
        "summed over attention_block:private_workspace + moe_block:grouped_mm (one layer of the TP harness), "
        "mean over the 5 fresh processes (load_cold_start). Call 2, not call 1: the fresh process's call 1 "
        "(attention path 1.1-1.6 s: Triton JIT compile or disk-cache load and the FlashMLA module load; "
        "the layer's blocks after it 0.09-0.12 s + 0.18-0.27 s) is paid before the timed requests, by "
        "vLLM's start-up profile run of max_num_batched_tokens tokens and at the latest by vllm bench "
        "serve's ready-check request; charged once per step, not per layer"),
    "cold_sd_ms": (0.0798, "ms", "measured",
        "data/measured/h200/between_process/cold_start.csv, columns wall_ms - steady_wall_ms at call == 2 "
        "(the layer's two blocks summed, as cold_extra_ms): sd (ddof 1) over the 5 fresh processes"),
    "cold_min_tokens": (8192, "tokens", "assumed",
        "assumed: a step this large is the first of its size since start-up (the ready check is one "
        "1024-token request)"),
}.items()}


def _gamma(rng: np.random.Generator, mean: float, sd: float) -> float:
    """One gamma draw of ``mean`` and ``sd`` (``mean`` itself when ``rng`` is None or ``sd`` is 0)."""
    if rng is None or sd == 0.0 or mean == 0.0:
        return mean
    k = (mean / sd) ** 2
    return float(rng.gamma(shape=k, scale=mean / k))


@dataclass(frozen=True)
class ArrivalModel:
    """The API server's hand-off as a single-server queue (ms). Raises ValueError: a negative or non-finite field."""

    first_ms: float = COMPONENTS["arrival_first_ms"]["value"]
    per_request_ms: float = COMPONENTS["arrival_per_request_ms"]["value"]
    cv: float = COMPONENTS["arrival_cv"]["value"]

    def __post_init__(self) -> None:
        for k in ("first_ms", "per_request_ms", "cv"):
            check_float(k, getattr(self, k), low=0.0, low_inclusive=True)

    def delays_s(self, arrivals_s: Sequence[float], rng: np.random.Generator | None = None) -> np.ndarray:
        """Per request (in the order given), s from its arrival at the client to the engine core: in arrival order
        ``done_k = max(arrival_k + first, done_{k-1}) + service_k``, ``service_k`` ``per_request_ms`` (``rng`` None)
        or a gamma draw of sd ``cv * per_request_ms``. Exact when send = arrival, as in the PR's benchmark."""
        a = np.asarray(arrivals_s, dtype=np.float64)
        out, done = np.empty_like(a), -math.inf
        first, mean, sd = self.first_ms / 1e3, self.per_request_ms / 1e3, self.cv * self.per_request_ms / 1e3
        for i in np.argsort(a, kind="stable"):
            done = max(a[i] + first, done) + _gamma(rng, mean, sd)
            out[i] = done - a[i]
        return out


@dataclass(frozen=True)
class NoiseConfig:
    """The components of one run (defaults, units and sources: :data:`COMPONENTS`; ``run_sigma`` / ``step_sigma``
    log-normal sds of the per-run and per-step GPU-time factors); ``sources``: component -> status and source.
    Raises ValueError: a negative or non-finite field, one line naming it."""

    arrival: ArrivalModel = field(default_factory=ArrivalModel)
    cpu_step_ms: float = COMPONENTS["cpu_step_ms"]["value"]
    output_delay_ms: float = COMPONENTS["output_delay_ms"]["value"]
    run_sigma: float = COMPONENTS["run_sigma"]["value"]
    step_sigma: float = COMPONENTS["step_sigma"]["value"]
    cold_extra_ms: float = COMPONENTS["cold_extra_ms"]["value"]
    cold_sd_ms: float = COMPONENTS["cold_sd_ms"]["value"]
    cold_min_tokens: int = COMPONENTS["cold_min_tokens"]["value"]
    sources: dict = field(default_factory=lambda: {k: {"status": v["status"], "source": v["source"]}
                                                   for k, v in COMPONENTS.items()})

    def __post_init__(self) -> None:
        if not isinstance(self.arrival, ArrivalModel):
            raise ValueError(f"arrival={self.arrival!r} must be an ArrivalModel")
        for k in ("cpu_step_ms", "output_delay_ms", "run_sigma", "step_sigma", "cold_extra_ms", "cold_sd_ms"):
            check_float(k, getattr(self, k), low=0.0, low_inclusive=True)
        check_int("cold_min_tokens", self.cold_min_tokens)

    def without_noise(self) -> NoiseConfig:
        """The same components at their means: no arrival jitter, no step-time noise, a fixed cold extra."""
        return replace(self, arrival=replace(self.arrival, cv=0.0), run_sigma=0.0, step_sigma=0.0, cold_sd_ms=0.0)

    @classmethod
    def none(cls) -> NoiseConfig:
        """Nothing at all: every request at the engine when sent, no CPU time, no delay, no noise, no cold step
        (with async scheduling off, :func:`simulate_once` is then the lab's original :func:`simulate`)."""
        return cls(arrival=ArrivalModel(0.0, 0.0, 0.0), cpu_step_ms=0.0, output_delay_ms=0.0, run_sigma=0.0,
                   step_sigma=0.0, cold_extra_ms=0.0, cold_sd_ms=0.0)

    def with_measurements(self, measured: dict) -> NoiseConfig:
        """A copy with ``measured["values"]`` (field -> value) put in, marked measured, each one's source
        ``measured["sources"][field]`` or ``measured["source"]``."""
        vals, per = measured.get("values", {}), measured.get("sources", {})
        src = {k: dict(v) for k, v in self.sources.items()} | {
            k: {"status": "measured", "source": per.get(k, measured.get("source", "cold_start.csv"))} for k in vals}
        return replace(self, sources=src, **vals)

    def record(self) -> dict:
        """Every field as plain data, with each component's status and source (:meth:`from_record` inverts it)."""
        return {"values": {k: v for k, v in asdict(self).items() if k != "sources"}, "sources": self.sources}

    @classmethod
    def from_record(cls, rec: dict) -> NoiseConfig:
        """The :class:`NoiseConfig` :meth:`record` wrote. Raises ValueError: not such a record, a value out of range."""
        if not isinstance(rec, dict) or not isinstance(rec.get("values"), dict):
            raise ValueError("rec must be a dict with a 'values' dict, as NoiseConfig.record() writes it")
        v = dict(rec["values"])
        arr = v.pop("arrival", {})
        if not isinstance(arr, dict):
            raise ValueError(f"rec['values']['arrival']={arr!r} must be a dict of ArrivalModel fields")
        return cls(arrival=ArrivalModel(**arr), sources=dict(rec.get("sources", {})), **v)


class CachedPricer:
    """``pricer`` (one that reads only what :func:`~mla_lab.serving.step_pricer.step_key` holds) priced once per key;
    ``hits`` / ``misses``."""

    def __init__(self, pricer: StepPricer):
        if not callable(pricer):
            raise ValueError(f"pricer={pricer!r} must be callable as pricer(step) -> ms")
        self.pricer, self.cache, self.hits, self.misses = pricer, {}, 0, 0

    def __call__(self, step: Step) -> float:
        k = step_key(step)
        hit = k in self.cache
        self.hits, self.misses = self.hits + hit, self.misses + (not hit)
        return self.cache[k] if hit else self.cache.setdefault(k, float(self.pricer(step)))


class _RunPricer:
    """One run's step times: the cached GPU time x the run factor x a per-step factor, + the cold extra once."""

    def __init__(self, base: StepPricer, noise: NoiseConfig, rng: np.random.Generator | None):
        self.base, self.noise, self.rng = base, noise, rng
        self.run_factor = math.exp(rng.normal(0.0, noise.run_sigma)) if rng is not None and noise.run_sigma else 1.0
        self.cold_ms, self.cold_done = _gamma(rng, noise.cold_extra_ms, noise.cold_sd_ms), False

    def __call__(self, step: Step) -> float:
        ms = self.base(step) * self.run_factor
        if self.rng is not None and self.noise.step_sigma:
            ms *= math.exp(self.rng.normal(0.0, self.noise.step_sigma))
        if not self.cold_done and step.num_tokens >= self.noise.cold_min_tokens:
            self.cold_done = True
            ms += self.cold_ms
        return ms


def simulate_once(bench: BenchConfig, sched: SchedulerConfig, pricer: StepPricer, noise: NoiseConfig,
                  rng: np.random.Generator | None = None, percentiles: Sequence[float] = (99,)) -> ServingResult:
    """One run with ``noise``'s components, ``pricer`` giving GPU ms per step; ``rng=None``: every random quantity at
    its mean (the deterministic run). Raises ValueError: as :func:`~mla_lab.serving.simulate.simulate`; ``noise``
    not a :class:`NoiseConfig`."""
    if not isinstance(noise, NoiseConfig):
        raise ValueError(f"noise={noise!r} must be a NoiseConfig")
    delays = noise.arrival.delays_s(arrival_times(bench), rng)
    return simulate(bench, sched, _RunPricer(pricer, noise, rng), percentiles=percentiles,
                    engine_delay_s=list(delays), cpu_step_ms=noise.cpu_step_ms,
                    output_delay_s=noise.output_delay_ms / 1e3)


@dataclass(frozen=True)
class NoiseResult:
    """:func:`run_noise`'s runs: ``a`` / ``b`` per metric of :data:`METRICS` a float64 array of ``num_runs``
    independent runs of each build, ``change`` ``(b - a) / a * 100`` run by run (%), ``deterministic_*`` the runs at
    the means, ``identical`` True for A vs A'."""

    a: dict
    b: dict
    change: dict
    deterministic_a: dict
    deterministic_b: dict
    num_runs: int
    seed: int
    noise: NoiseConfig
    identical: bool
    cache: dict

    def _values(self, metric: str, which: str) -> np.ndarray:
        if which not in ("a", "b", "change"):
            raise ValueError(f"which={which!r} must be one of ['a', 'b', 'change']")
        if metric not in getattr(self, which):
            raise ValueError(f"metric={metric!r} must be one of {list(METRICS)}")
        return getattr(self, which)[metric]

    def quantiles(self, metric: str, which: str = "change", qs: Sequence[float] = (2.5, 50, 97.5)) -> list[float]:
        """Percentiles ``qs`` (``np.percentile`` linear) of ``metric`` in ``which`` (a, b or change)."""
        return [float(x) for x in np.percentile(self._values(metric, which), list(qs))]

    def band(self, metric: str, which: str = "change", level: float = 95.0) -> tuple[float, float]:
        """The central ``level`` % band of ``metric`` in ``which``: one run's spread."""
        check_float("level", level, low=0.0, high=100.0)
        return tuple(self.quantiles(metric, which, ((100 - level) / 2, (100 + level) / 2)))

    def deterministic_change(self, metric: str) -> float:
        """``(b - a) / a * 100`` of ``metric`` between the two deterministic runs (%)."""
        return (self.deterministic_b[metric] - self.deterministic_a[metric]) / self.deterministic_a[metric] * 100.0

    def percentile_of(self, metric: str, value: float, which: str = "change") -> float:
        """The percent of runs of ``metric`` in ``which`` below ``value`` (ties count half)."""
        v = self._values(metric, which)
        x = check_float("value", value, low=-math.inf)
        return float(100.0 * (np.sum(v < x) + 0.5 * np.sum(v == x)) / len(v))


def run_noise(bench: BenchConfig, sched: SchedulerConfig, pricer_a: StepPricer, pricer_b: StepPricer | None = None,
              *, sched_b: SchedulerConfig | None = None, num_runs: int = 200, seed: int = 0,
              noise: NoiseConfig | None = None, percentiles: Sequence[float] = (99,)) -> NoiseResult:
    """``num_runs`` single runs of build A (``pricer_a`` on ``sched``) and B (``pricer_b`` on ``sched_b``; None: A
    again, A vs A'); run ``i`` of build ``j`` draws from ``SeedSequence([seed, j, i])``, independent of ``num_runs``;
    each pricer in one :class:`CachedPricer`; 99 always among ``percentiles``.

    Raises:
        ValueError: ``num_runs`` < 2, a bad seed, ``noise`` of the wrong type, as :func:`simulate_once`.
    """
    check_int("num_runs", num_runs)
    if num_runs < 2:
        raise ValueError(f"num_runs={num_runs!r} must be an int >= 2")
    check_int("seed", seed, allow_zero=True)
    noise = NoiseConfig() if noise is None else noise
    if not isinstance(noise, NoiseConfig):
        raise ValueError(f"noise={noise!r} must be a NoiseConfig")
    percentiles = tuple(sorted(set(percentiles) | {99}))  # METRICS holds the p99 keys
    ca = CachedPricer(pricer_a)
    cb = ca if pricer_b is None else CachedPricer(pricer_b)
    builds = ((ca, sched), (cb, sched if sched_b is None else sched_b))
    runs = [[simulate_once(bench, sc, pr, noise, np.random.default_rng([seed, j, i]), percentiles).metrics
             for i in range(num_runs)] for j, (pr, sc) in enumerate(builds)]
    out = [{k: np.array([m[k] for m in ms], dtype=np.float64) for k in METRICS} for ms in runs]
    det = [simulate_once(bench, sc, pr, noise, None, percentiles).metrics for pr, sc in builds]
    change = {k: (out[1][k] - out[0][k]) / out[0][k] * 100.0 for k in METRICS}
    cache = {"a": {"hits": ca.hits, "misses": ca.misses}, "b": {"hits": cb.hits, "misses": cb.misses}}
    return NoiseResult(out[0], out[1], change, *({k: m[k] for k in METRICS} for m in det), num_runs, seed, noise,
                       pricer_b is None, cache)


# ------------------------------------------------------------------------------------------ H200 measurements
#: Required columns of ``cold_start.csv`` (the cold_start experiment, ``mla-lab measure``; one row per fresh process,
#: case and call); see :func:`load_cold_start`.
COLD_START_COLUMNS = ("process", "what", "call", "wall_ms", "gpu_ms", "steady_wall_ms", "steady_gpu_ms", "T")
_LAYER_PARTS = ("attention_block:", "moe_block:")


def _numbers(p: Path, df: pd.DataFrame, cols) -> pd.DataFrame:
    """``df`` (read as text) with ``cols`` as floats. Raises ValueError: a value that is not a finite number (one
    line naming the file, the line and the column)."""
    df = df.copy()
    for c in cols:
        x = pd.to_numeric(df[c], errors="coerce")
        bad = ~np.isfinite(x.to_numpy(dtype=np.float64))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{p} line {df.index[i] + 2}: {c}={df[c].iloc[i]!r} must be a finite number")
        df[c] = x.astype(np.float64)
    return df


def load_cold_start(path: str | Path, spread_path: str | Path | None = None, min_tokens: int = 8192) -> dict:
    """The cold first large step measured on the H200 (``data/measured/h200/between_process/``): per process, summed
    over the layer's cases (``attention_block:*`` + ``moe_block:*``, else one ``attention_path:*``; ``T >=
    min_tokens``), ``cold_extra_ms`` = mean of ``wall(call 2) - steady_wall`` (why call 2: :data:`COMPONENTS`;
    ``cold_call1_ms`` beside it), ``cold_sd_ms`` their sd (ddof 1). ``layer_spread`` (contrast only): ``run_log_sd``
    of ``log(steady_gpu)`` over processes, ``step_rel_sd`` the median ``sd(gpu) / median(gpu)`` of
    ``step_spread.csv`` (beside it, optional).

    Returns:
        ``{"values": {"cold_extra_ms", "cold_sd_ms"}, "cold_call1_ms", "layer_spread", "source", "cases",
        "num_processes"}``.

    Raises:
        ValueError: the file or a required column is missing, a value is not a finite number, or no usable row is
            left; one line naming the file (and the line and column).
    """
    p = Path(path)
    check_int("min_tokens", min_tokens)
    if not p.is_file():
        raise ValueError(f"path={str(p)!r} does not exist; it must be a cold_start.csv (columns "
                         f"{', '.join(COLD_START_COLUMNS)}) from the cold_start experiment (mla-lab measure)")
    raw = pd.read_csv(p, dtype=str, keep_default_na=False)
    if missing := [c for c in COLD_START_COLUMNS if c not in raw.columns]:
        raise ValueError(f"{p}: column {missing[0]!r} is missing; required: {', '.join(COLD_START_COLUMNS)}")
    df = _numbers(p, raw, [c for c in COLD_START_COLUMNS if c != "what"])
    df = df[df["T"] >= min_tokens]
    whats = sorted(set(df["what"]))  # the layer: one attention_block:* and one moe_block:*, else one attention_path:*
    layer = [next(w for w in whats if w.startswith(pre)) for pre in _LAYER_PARTS
             if any(w.startswith(pre) for w in whats)]
    if len(layer) < len(_LAYER_PARTS):
        layer = [w for w in whats if w.startswith("attention_path:")][:1]
    if not layer:
        raise ValueError(f"{p}: no attention_block/moe_block or attention_path rows with T >= {min_tokens}")
    d = df[df["what"].isin(layer)].assign(call=lambda x: x["call"].astype(int))
    d = d[d["call"].isin([1, 2])].drop_duplicates(["process", "what", "call"], keep="last")
    d = d.groupby("process", sort=False).filter(lambda g: len(g) == 2 * len(layer))
    if d.empty:
        raise ValueError(f"{p}: no process has calls 1 and 2 of every case of {layer}")
    extra = d.assign(extra=d["wall_ms"] - d["steady_wall_ms"])
    per = {c: extra[extra["call"] == c].groupby("process", sort=False)[["extra", "steady_gpu_ms"]].sum()
           for c in (1, 2)}
    cold2, n = per[2]["extra"].to_numpy(), len(per[2])
    vals: dict = {"cold_extra_ms": max(0.0, float(np.mean(cold2)))}
    layer_spread: dict = {}
    if n >= 2:
        vals["cold_sd_ms"] = float(np.std(cold2, ddof=1))
        layer_spread["run_log_sd"] = float(np.std(np.log(per[1]["steady_gpu_ms"].to_numpy()), ddof=1))
    sp = Path(spread_path) if spread_path is not None else p.with_name("step_spread.csv")
    if rel := (_step_rel_sds(sp, layer) if sp.is_file() else []):
        layer_spread["step_rel_sd"] = float(np.median(rel))
    return {"values": vals, "cold_call1_ms": float(np.mean(per[1]["extra"].to_numpy())), "layer_spread": layer_spread,
            "cases": layer, "num_processes": n,
            "source": f"{p.name}{' + ' + sp.name if sp.is_file() else ''} (cases {' + '.join(layer)}, "
                      f"{n} fresh process(es))"}


def _step_rel_sds(sp: Path, layer: list[str]) -> list[float]:
    """Per process, ``sd(gpu) / median(gpu)`` of the layer's steady samples in ``step_spread.csv`` (the cases
    summed sample by sample)."""
    raw = pd.read_csv(sp, dtype=str, keep_default_na=False)
    df = _numbers(sp, raw[raw["what"].isin(layer)], ("process", "sample", "gpu_ms"))
    s = df.groupby(["process", "sample"], sort=False)["gpu_ms"].sum()
    return [float(np.std(v, ddof=1) / np.median(v)) for v in
            (g.to_numpy() for _, g in s.groupby(level="process", sort=False)) if len(v) >= 2]


#: What :func:`serve_benchmark_noise` summarises per metric, and the labels :func:`format_noise` prints.
NOISE_METRICS = SERVE_METRICS[1:12]


def serve_benchmark_noise(deployment: Deployment, strategies, bench: BenchConfig | None = None, *,
                          num_runs: int = 200, seed: int = 0, noise: NoiseConfig | None = None,
                          block_size: int = 64, baseline: str | None = None, calibration: Calibration | None = None,
                          decode_cal: DecodeCalibration | None = None) -> dict:
    """``num_runs`` single runs per strategy (async scheduling on, vLLM's default), each with its KV capacity from
    :func:`~mla_lab.serving.serve_benchmark` (the arguments as there), priced by ``CostModelPricer`` of
    ``deployment.rank``; the baseline's runs (build 0) are the same in every pair.

    Returns:
        ``{"num_runs", "seed", "baseline", "noise" (its record), "strategies": {s: {metric: {"median", "band95"}}},
        "changes": {s: {metric: {"median", "band95", "deterministic"}}} (%), "note"}``, metrics :data:`NOISE_METRICS`.

    Raises:
        ValueError: ``num_runs`` < 2; as :func:`~mla_lab.serving.serve_benchmark` and :func:`run_noise`.
    """
    Deployment.require(deployment)
    check_int("num_runs", num_runs)
    if num_runs < 2:
        raise ValueError(f"num_runs={num_runs!r} must be an int >= 2 (1 is the deterministic serve_benchmark)")
    if deployment.num_speculative_tokens or deployment.dp_attention > 1:
        raise ValueError(f"deployment with num_speculative_tokens={deployment.num_speculative_tokens}, dp_attention="
                         f"{deployment.dp_attention}: the noise model does not price these options; allowed: "
                         "serve_benchmark (deterministic) for them, or num_speculative_tokens=0 and dp_attention=1")
    bench = bench_of(deployment) if bench is None else bench
    det = serve_benchmark(deployment, strategies, bench, block_size=block_size, calibration=calibration,
                          decode_cal=decode_cal, **({} if baseline is None else {"baseline": baseline}))
    base = det["baseline"]
    scheds = {s: async_scheduler(deployment, r["kv_capacity_tokens"], block_size) for s, r in det["strategies"].items()}
    pricers = {s: CachedPricer(CostModelPricer(deployment.rank, s, calibration, decode_cal)) for s in scheds}
    keys = [k for k, _ in NOISE_METRICS]
    res = {s: run_noise(bench, scheds[base], pricers[base], None if s == base else pricers[s],
                        sched_b=scheds[s], num_runs=num_runs, seed=seed, noise=noise) for s in det["strategies"]}

    def summ(r: NoiseResult, which: str, k: str) -> dict:
        return {"median": r.quantiles(k, which)[1], "band95": list(r.band(k, which))}

    return {"num_runs": num_runs, "seed": seed, "baseline": base, "noise": res[base].noise.record(),
            "strategies": {s: {k: summ(r, "a" if s == base else "b", k) for k in keys} for s, r in res.items()},
            "changes": {s: {k: {**summ(r, "change", k), "deterministic": r.deterministic_change(k)} for k in keys}
                        for s, r in res.items() if s != base},
            "note": "modelled: single runs of the noise model (mla_lab.serving.noise: API-server arrival queue, async "
                    "scheduling, per-step CPU time, token delivery, measured step-time spreads and cold first "
                    "step); the deterministic table has none of these components"}


def format_noise(runs: dict) -> str:
    """:func:`serve_benchmark_noise`'s result as terminal lines (medians and 95 % bands; changes in %)."""
    lines = [f"single-run spread over {runs['num_runs']} simulated runs per strategy (seed {runs['seed']}; "
             "median [95 % band]):"]
    blocks = [(f"  {s}{' (baseline)' if s == runs['baseline'] else ''}", m, ">12,.2f", ",.2f")
              for s, m in runs["strategies"].items()]
    blocks += [(f"  change {s} vs {runs['baseline']}, one run of each (%):", m, ">+12.2f", "+.2f")
               for s, m in runs["changes"].items()]
    for head, m, f_med, f in blocks:
        lines.append(head)
        for k, label in NOISE_METRICS:
            lo, hi = m[k]["band95"]
            lines.append(f"    {label:<32}{m[k]['median']:{f_med}}  [{lo:{f}}, {hi:{f}}]")
    lines.append(runs["note"])
    return "\n".join(lines)
