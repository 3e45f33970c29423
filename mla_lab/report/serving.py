"""The report's serving section, all **modelled** (:func:`mla_lab.serving.benchmark.serve_benchmark`): the PR's
benchmark as ``vllm bench serve`` prints it per strategy (:func:`serving_table`), the swept deployment's run
(:func:`serve_swept`, :func:`plot_serving_changes`) and a request-rate curve (:func:`rate_curve`)."""

from __future__ import annotations

import itertools
import math
from collections import namedtuple

import pandas as pd

from ..arch import get_arch
from ..deployment import Deployment
from ..model.memory import memory_tradeoff
from ..placement import BASELINE, PR_STRATEGY, preset_label, preset_of
from ..seed import SEED_REPORTED
from ..serving.benchmark import bench_of, serve_benchmark
from ..serving.client import BenchConfig
from ..serving.noise import serve_benchmark_noise
from .cache import cached_call
from .figures import FP8_KV_NOTE, new_figure, strategy_style
from .tables import html_table

__all__ = ["serving_display_table", "serving_table", "rate_curve", "plot_rate_curve", "PRINTED_METRICS", "PR_STRATEGY",
           "REPORTED_CHANGE", "SERVING_TABLE_COLUMNS", "swept_deployment", "serve_swept", "plot_serving_changes",
           "serving_details_html", "CHANGE_METRICS", "serve_swept_cached", "plotted", "kv_dtypes_left_out"]

#: What ``vllm bench serve`` prints, in its order and with its labels (``vllm/benchmarks/serve.py``; the latency
#: blocks for its default ``--percentile-metrics ttft,tpot,itl`` and ``--metric-percentiles 99``).
PRINTED_METRICS = (
    ("completed", "Successful requests"), ("failed", "Failed requests"),
    ("duration", "Benchmark duration (s)"), ("total_input_tokens", "Total input tokens"),
    ("total_output_tokens", "Total generated tokens"), ("request_throughput", "Request throughput (req/s)"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("max_output_tokens_per_s", "Peak output token throughput (tok/s)"),
    ("max_concurrent_requests", "Peak concurrent requests"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
    ("mean_ttft_ms", "Mean TTFT (ms)"), ("median_ttft_ms", "Median TTFT (ms)"), ("p99_ttft_ms", "P99 TTFT (ms)"),
    ("mean_tpot_ms", "Mean TPOT (ms)"), ("median_tpot_ms", "Median TPOT (ms)"), ("p99_tpot_ms", "P99 TPOT (ms)"),
    ("mean_itl_ms", "Mean ITL (ms)"), ("median_itl_ms", "Median ITL (ms)"), ("p99_itl_ms", "P99 ITL (ms)"),
)
#: The PR's reported changes, by metric (the PR says "TTFT": taken as the mean, the first TTFT line printed).
REPORTED_CHANGE = {"mean_ttft_ms": SEED_REPORTED["ttft_change_pct"],
                   "total_token_throughput": SEED_REPORTED["throughput_change_pct"]}
SERVING_TABLE_COLUMNS = ("model", "tp", "arch", "strategy", "preset", "metric", "label", "value", "baseline",
                         "change_pct", "reported_change_pct", "source")


def serving_table(result: dict, wide: bool = False) -> pd.DataFrame:
    """A serve_benchmark result as a table: one row per (strategy, metric) with :data:`SERVING_TABLE_COLUMNS`, or
    (``wide``) one row per metric label, columns ``(strategy, "value" | "change %")`` and the PR's reported change.
    Raises ValueError: ``result`` is not a serve_benchmark result."""
    _check_result(result)
    dep = result.get("deployment", {})
    base = result["strategies"][result["baseline"]]["metrics"]
    rows = [{"model": dep.get("model"), "tp": dep.get("tp"), "arch": dep.get("arch"), "strategy": s,
             "preset": preset_label(r.get("preset") or preset_of(s)), "metric": key, "label": label,
             "value": float(r["metrics"][key]), "baseline": math.nan if base.get(key) is None else float(base[key]),
             "change_pct": r["change_pct"].get(key, math.nan),
             "reported_change_pct": REPORTED_CHANGE.get(key, math.nan) if s == PR_STRATEGY else math.nan,
             "source": "modelled"}
            for s, r in result["strategies"].items() for key, label in PRINTED_METRICS if key in r["metrics"]]
    df = pd.DataFrame(rows, columns=list(SERVING_TABLE_COLUMNS))
    return _wide(df, list(result["strategies"])) if wide else df


def _check_result(result) -> None:
    if not isinstance(result, dict) or "strategies" not in result or "baseline" not in result:
        raise ValueError("result must be the dict mla_lab.serving.serve_benchmark returns")


def _wide(df: pd.DataFrame, strategies: list) -> pd.DataFrame:
    order = [label for _, label in PRINTED_METRICS if label in set(df["label"])]
    piv = {c: df.pivot(index="label", columns="strategy", values=c).reindex(order) for c in ("value", "change_pct")}
    cols = {(s, name): piv[c][s] for s in strategies for c, name in (("value", "value"), ("change_pct", "change %"))}
    rep = df[df["strategy"] == PR_STRATEGY].set_index("label")["reported_change_pct"].reindex(order)
    out = pd.DataFrame({**cols, ("PR #53878 reported", "change %"): rep})
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    return out


def serving_display_table(result: dict) -> pd.DataFrame:
    """:func:`serving_table` (wide) with the metric names as the first column, flat column names, blanks for NaN."""
    w = serving_table(result, wide=True)
    flat = pd.DataFrame({f"{a}, {b}": w[(a, b)] for a, b in w.columns})
    flat = flat.astype(object).where(flat.notna(), "")
    flat.insert(0, "metric (vllm bench serve; modelled)", list(w.index))
    return flat.reset_index(drop=True)


#: The changes the rate curve gives a single-run band (``band_<metric>_lo/hi``).
RATE_BAND_METRICS = ("median_ttft_ms", "p99_ttft_ms", "total_token_throughput")
#: The changes each rate-curve row carries (``change_<metric>_pct``).
RATE_CHANGE_METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
                       "total_token_throughput")


def rate_curve(deployment: Deployment, strategies, rates, *, seed: int = 0, baseline: str = BASELINE,
               num_runs: int = 20) -> pd.DataFrame:
    """:func:`~mla_lab.serving.benchmark.serve_benchmark` of ``deployment`` at each request rate of ``rates`` (req/s;
    ``inf``: all at t = 0), each finite rate with the 95 % band (%) of ``num_runs`` single runs
    (:func:`mla_lab.serving.noise.serve_benchmark_noise`, issue 32). One row per (strategy, rate): the deployment,
    ``request_rate``, every metric, ``change_<metric>_pct`` (:data:`RATE_CHANGE_METRICS`), ``band_<metric>_lo/hi``
    (:data:`RATE_BAND_METRICS`), ``band``, ``source`` ``modelled``. Raises ValueError: no rates, a rate that is not > 0;
    as serve_benchmark."""
    rates = list(rates)
    if not rates:
        raise ValueError("rates=[] must hold at least one request rate (req/s, > 0; inf allowed)")
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not r > 0:
            raise ValueError(f"rate={r!r} must be a number > 0 (req/s; float('inf') = every request at t = 0)")
    return pd.DataFrame([row for rate in rates for row in _rate_rows(deployment, strategies, float(rate), seed,
                                                                     baseline, num_runs)])


def _rate_rows(deployment, strategies, rate: float, seed: int, baseline: str, num_runs: int) -> list[dict]:
    bench = bench_of(deployment, request_rate=rate, seed=seed)
    res = serve_benchmark(deployment, strategies, bench, baseline=baseline)
    bands, band = {}, ("deterministic: every request at t=0" if math.isinf(rate) else "one run: band unknown")
    if not math.isinf(rate) and num_runs > 1:
        bands = serve_benchmark_noise(deployment, strategies, bench, num_runs=num_runs, seed=seed,
                                      baseline=baseline)["changes"]
        band = f"95 % band over {num_runs} single runs (mla_lab.serving.noise)"
    dep, rows = res["deployment"], []
    for s, r in res["strategies"].items():
        row = {"model": dep["model"], "tp": dep["tp"], "arch": dep["arch"], "strategy": s,
               "preset": preset_label(r["preset"]), "request_rate": rate, **r["metrics"],
               **{f"change_{k}_pct": r["change_pct"].get(k, math.nan) for k in RATE_CHANGE_METRICS}}
        for k in RATE_BAND_METRICS:
            row[f"band_{k}_lo"], row[f"band_{k}_hi"] = (bands.get(s, {}).get(k) or {}).get("band95", (math.nan,) * 2)
        rows.append({**row, "band": band, "source": "modelled"})
    return rows


def _rate_lines(ax_t, ax_p, d: pd.DataFrame, pos: dict, s: str) -> None:
    """One strategy's p50 (solid) and p99 (dashed) TTFT change and throughput change, with the p50's single-run
    band as error bars where the rows carry one."""
    colour, marker, name = strategy_style(s)
    x = [pos[r] for r in d["request_rate"]]
    ax_t.plot(x, d["change_median_ttft_ms_pct"], color=colour, marker=marker, ls="-", label=f"{name} p50")
    ax_t.plot(x, d["change_p99_ttft_ms_pct"], color=colour, marker=marker, ls="--", label=f"{name} p99")
    ax_p.plot(x, d["change_total_token_throughput_pct"], color=colour, marker=marker, ls="-", label=name)
    for ax, k in ((ax_t, "median_ttft_ms"), (ax_p, "total_token_throughput")):
        if f"band_{k}_lo" in d.columns and d[f"band_{k}_lo"].notna().any():
            b = d[d[f"band_{k}_lo"].notna()]
            y = b[f"change_{k}_pct"]
            ax.errorbar([pos[r] for r in b["request_rate"]], y,
                        yerr=[(y - b[f"band_{k}_lo"]).clip(lower=0), (b[f"band_{k}_hi"] - y).clip(lower=0)],
                        fmt="none", ecolor=colour, elinewidth=1.0, capsize=3, alpha=0.8)


def _fitted_legend(fig, handles, cap: int = 4) -> None:
    """The legend below the axes, as many columns (at most ``cap``) as fit the figure's width (8 pt: ~4.8 pt a
    character)."""
    longest = max((len(h.get_label()) for h in handles), default=1)
    fig.legend(handles=handles, loc="outside lower center", frameon=False, fontsize=8,
               ncols=max(1, min(len(handles), cap, int(fig.get_figwidth() * 72 / (4.8 * longest + 40)))))


def plot_rate_curve(df: pd.DataFrame):
    """The change vs the baseline (%) against the request rate of one deployment's :func:`rate_curve` rows: TTFT p50
    (solid), p99 (dashed) and total token throughput, one colour per strategy, rates as categories (``inf`` last).
    Raises ValueError: an empty frame, missing columns, or rows of more than one deployment."""
    from matplotlib.lines import Line2D

    need = {"strategy", "request_rate", "change_median_ttft_ms_pct", "change_p99_ttft_ms_pct",
            "change_total_token_throughput_pct"}
    if not isinstance(df, pd.DataFrame) or df.empty or not need <= set(df.columns):
        raise ValueError(f"df must be rate_curve()'s non-empty DataFrame with columns {sorted(need)}")
    deps = df[[c for c in ("model", "tp", "arch") if c in df.columns]].drop_duplicates()
    if len(deps) > 1:
        raise ValueError(f"df holds {len(deps)} deployments; plot one at a time (filter by model, tp, arch)")
    rates = sorted(df["request_rate"].unique(), key=lambda r: (math.isinf(r), r))
    pos = {r: i for i, r in enumerate(rates)}
    fig = new_figure((10.0, 4.2))
    ax_t, ax_p = fig.subplots(1, 2)
    ttft = ["change_median_ttft_ms_pct", "change_p99_ttft_ms_pct"]
    strategies = [s for s in dict.fromkeys(df["strategy"]) if df[df["strategy"] == s][ttft].abs().max().max() != 0]
    for s in strategies:
        _rate_lines(ax_t, ax_p, df[df["strategy"] == s].sort_values("request_rate", key=lambda c: c.map(pos)), pos, s)
    for ax in (ax_t, ax_p):
        ax.set_xticks(range(len(rates)), ["inf" if math.isinf(r) else f"{r:g}" for r in rates])
        ax.set_xlabel("request rate (req/s)")
        ax.axhline(0, color="k", lw=0.6)
        ax.grid(alpha=0.3)
    ax_t.set_ylabel("TTFT change vs baseline [%]")
    banded = "band" in df.columns and df["band"].astype(str).str.startswith("95").any()
    ax_t.set_title("TTFT p50 (solid) and p99 (dashed) change" + ("\nbars: p50's 95 % band over single runs"
                                                                 if banded else ""), fontsize=9)
    ax_p.set_ylabel("total token throughput change [%]")
    ax_p.set_title("total token throughput change", fontsize=9)
    if len(deps):
        r0 = df.iloc[0]
        fig.suptitle(f"{r0.get('model', '')} TP{r0.get('tp', '')} {r0.get('arch', '')}: vllm bench serve vs request "
                     "rate, change vs the baseline (modelled)", fontsize=10)
    handles = [Line2D([], [], color=strategy_style(s)[0], marker=strategy_style(s)[1], label=strategy_style(s)[2])
               for s in strategies]
    _fitted_legend(fig, handles + [Line2D([], [], color="0.3", ls="-", label="p50"),
                                   Line2D([], [], color="0.3", ls="--", label="p99")])
    return fig


# ----------------------------------------------------------------------------- the swept deployment's serving run
#: The metrics the serving figure shows, as ``vllm bench serve`` labels them.
CHANGE_METRICS = (("mean_ttft_ms", "Mean TTFT"), ("median_ttft_ms", "Median TTFT"), ("p99_ttft_ms", "P99 TTFT"),
                  ("mean_tpot_ms", "Mean TPOT"), ("mean_itl_ms", "Mean ITL"),
                  ("total_token_throughput", "Total token throughput"), ("duration", "Benchmark duration"))
_PREFER = {"model": "glm-5", "tp": 8, "arch": "h200", "max_num_batched_tokens": 16384, "prompt_len": 1024}


def _ordered(values, preferred):
    vals = list(dict.fromkeys(values))
    return sorted(vals, key=lambda v: (v != preferred, vals.index(v)))


def swept_deployment(params):
    """``(Deployment, note)`` the serving section prices: the grid's point closest to the PR's (:data:`_PREFER`) that
    fits and holds one request in its KV cache, at the first KV-cache dtype (the note names the others,
    :func:`kv_dtypes_left_out`); or ``(None, why)``."""
    combos = itertools.product(_ordered(params.models, _PREFER["model"]), _ordered(params.tp_sizes, _PREFER["tp"]),
                               _ordered([get_arch(a).name for a in params.archs], _PREFER["arch"]),
                               _ordered(params.max_num_batched_tokens, _PREFER["max_num_batched_tokens"]),
                               _ordered(params.prompt_lens, _PREFER["prompt_len"]))
    why = "the grid is empty"
    for m, tp, a, mbt, L in combos:
        try:
            dep = Deployment.of(model=m, tp=tp, arch=a, max_num_batched_tokens=mbt,
                                kv_cache_dtype=params.kv_cache_dtype[0], weight_dtype=params.weight_dtype,
                                moe_parallel=params.moe_parallel, prompt_len=L, num_prompts=params.num_prompts,
                                concurrency=params.concurrency, output_len=params.output_len,
                                gpu_memory_utilization=params.gpu_memory_utilization)
        except ValueError as e:
            why = str(e)
            continue
        cap = memory_tradeoff(dep, strategies=[BASELINE])["kv_capacity_tokens"]
        if cap >= L + params.output_len and mbt >= params.max_num_seqs:
            picked = (m, tp, a, mbt, L) == tuple(_PREFER.values())
            note = ("the PR's deployment" if picked else "the grid's point closest to the PR's deployment that fits")
            left = kv_dtypes_left_out(params)
            return dep, note + (f"; {left}" if left else "")
        why = (f"{m} TP{tp} {a}: max_num_batched_tokens {mbt} < max_num_seqs {params.max_num_seqs}"
               if mbt < params.max_num_seqs else f"{m} TP{tp} {a}: KV capacity {max(cap, 0):,.0f} tokens < one "
               f"request of {L + params.output_len}")
    return None, f"no deployment of the grid can serve the workload (last reason: {why})"


def kv_dtypes_left_out(params) -> str:
    """One line naming the KV-cache dtypes of ``params`` after the first (the one served and advised), issue 32."""
    dtypes = list(params.kv_cache_dtype)
    if len(dtypes) < 2:
        return ""
    rest = ", ".join(dtypes[1:])
    return (f"{dtypes[0]} KV only: the sweep's {rest} KV rows are not served or advised here (see the table at the "
            "end of the report and the CSV)" + (FP8_KV_NOTE if "fp8" in dtypes[1:] else ""))


def serve_swept(params, strategies, deployment: Deployment | None = None) -> dict:
    """:func:`~mla_lab.serving.serve_benchmark` for ``deployment`` (default :func:`swept_deployment`) with the sweep's
    request rate, max concurrency, seed and max_num_seqs. Raises ValueError: no deployment of the grid fits (the
    reason); as serve_benchmark."""
    dep = deployment
    if dep is None:
        dep, why = swept_deployment(params)
        if dep is None:
            raise ValueError(why)
    rate = math.inf if params.request_rate == "inf" else float(params.request_rate)
    if dep.max_num_seqs != params.max_num_seqs:
        dep = dep.replace(max_num_seqs=params.max_num_seqs)
    bench = BenchConfig(num_prompts=dep.num_prompts, random_input_len=dep.prompt_len, random_output_len=dep.output_len,
                        request_rate=rate, max_concurrency=params.concurrency, seed=params.seed)
    return serve_benchmark(dep, strategies, bench)


#: What :func:`serve_swept` reads of the sweep's parameters (the cache key of :func:`serve_swept_cached`).
_Workload = namedtuple("_Workload", "request_rate concurrency seed max_num_seqs")


def serve_swept_cached(params, strategies, deployment: Deployment) -> dict:
    """:func:`serve_swept` through :func:`mla_lab.report.cache.cached_call`. Raises as serve_swept."""
    work = _Workload(str(params.request_rate), params.concurrency, params.seed, params.max_num_seqs)
    return cached_call(serve_swept, work, list(strategies), deployment)


def plotted(result: dict) -> dict:
    """What :func:`plot_serving_changes` reads of a serve_benchmark result: the figure cache's key."""
    return {"baseline": result["baseline"], "deployment": result.get("deployment"), "bench": result.get("bench"),
            "strategies": {s: (r.get("preset"), r["metrics"], r["change_pct"])
                           for s, r in result["strategies"].items()}}


def plot_serving_changes(result: dict):
    """Per metric of :data:`CHANGE_METRICS`, each strategy's change vs the baseline (%, horizontal bars) of a
    serve_benchmark result (one deterministic simulation). Raises ValueError: not a serve_benchmark result."""
    _check_result(result)
    base = result["baseline"]
    others = [s for s in result["strategies"] if s != base]
    metrics = [(k, lbl) for k, lbl in CHANGE_METRICS if k in result["strategies"][base]["metrics"]]
    fig = new_figure((10.5, 0.24 * len(metrics) * max(1, len(others)) + 1.8))
    ax = fig.add_subplot()
    n = max(1, len(others))
    h = 0.8 / n
    for j, s in enumerate(others):
        colour, _, name = strategy_style(s)
        if name == s and result["strategies"][s].get("preset"):
            name = f"{preset_label(result['strategies'][s]['preset'])} ({s})"
        ys = [i + (j - (n - 1) / 2) * h for i in range(len(metrics))]
        vals = [result["strategies"][s]["change_pct"].get(k, math.nan) for k, _ in metrics]
        bars = ax.barh(ys, vals, h, color=colour, label=name)
        ax.bar_label(bars, labels=[("" if v != v else f"{v:+.1f} %") for v in vals], fontsize=7, padding=2)
    ax.set_yticks(range(len(metrics)), [lbl for _, lbl in metrics], fontsize=8.5)
    ax.invert_yaxis()
    ax.axvline(0, color="k", lw=0.6)
    lo, hi = ax.get_xlim()
    span = max(hi - lo, 1.0)
    ax.set_xlim(lo - 0.12 * span, hi + 0.12 * span)  # room for the value labels
    ax.set_xlabel(f"change vs {base} [%] (throughput: higher is better; latencies: lower is better)")
    ax.grid(axis="x", alpha=0.3)
    dep = result.get("deployment", {})
    b = result.get("bench", {})
    fig.suptitle(f"{dep.get('model')} TP{dep.get('tp')} {dep.get('arch')}: vllm bench serve, {b.get('num_prompts')} "
                 f"x {b.get('random_input_len')} in / {b.get('random_output_len')} out (modelled; one deterministic "
                 "simulation: no interval)", fontsize=10)
    _fitted_legend(fig, list(ax.containers), cap=3)  # 3: the long labels
    return fig


def serving_details_html(result: dict) -> str:
    """:func:`serving_display_table` folded in a ``<details>`` block that scrolls inside its own box."""
    table = html_table(serving_display_table(result), max_cols=None)  # folded whole: every strategy
    return ("<details><summary>the full table (every metric vllm bench serve prints)</summary><div "
            f"style='overflow-x:auto; max-width:100%'>{table}</div></details>")
