"""The route beats the copy: measured attention-path time per route and prompt length (H200, fresh processes).

Rows: ``data/measured/h200/between_process/routes.csv`` (``mla_lab/measure/experiments/routes_step.py``): a
16384-token prefill step per layer call, GLM-5 and DeepSeek-V3.2 TP8, padded sparse MQA (FlashMLA at h_q 64) and dense
MHA on the real heads (above top-k a lower bound of masked MHA). Each figure: the median over >= 5 fresh processes of
the per-process medians, ``[min, max]`` over processes (:mod:`mla_lab.measure.spread`).
"""

from __future__ import annotations

from pathlib import Path
from statistics import linear_regression

import pandas as pd

from ..measure.spread import between_process
from ..paths import measured_dir
from .figures import new_figure

__all__ = ["routes_available", "route_summary", "ROUTES_CSV", "ROUTE_LABELS", "route_table", "crossover", "plot_routes", "route_sentence", "mean_keys"]

ROUTES_CSV = "between_process/routes.csv"
#: Route label -> the parts summed per process (medians of interleaved rounds).
ROUTE_LABELS = {
    "sparse MQA, vLLM before #53878 (new_empty pad)": ("mqa:per_call_empty:zeros",),
    "sparse MQA, vLLM #53878 (pre-padded workspace)": ("mqa:private_workspace",),
    "dense MHA, real heads (SDPA cuDNN)": ("mha:upproj", "mha:assemble", "mha:sdpa:cudnn"),
    "dense MHA, real heads (SDPA FLASH)": ("mha:total",),
}
#: The routes :func:`route_sentence` names (before the PR, the PR's, dense cuDNN) and :func:`crossover` fits.
_PRE, _SPARSE, _DENSE = list(ROUTE_LABELS)[:3]


def routes_available(path: str | Path | None = None) -> bool:
    """Whether the measured route rows exist (``MLA_LAB_MEASURED`` may point the lab at another measured folder)."""
    return (Path(path) if path else measured_dir("h200") / ROUTES_CSV).exists()


def route_summary(path: str | Path | None = None, model: str = "glm-5") -> list[str]:
    """The report's sentences on the routes (:func:`route_sentence`, the crossover), or why there are none."""
    if not routes_available(path):
        where = Path(path) if path else measured_dir("h200") / ROUTES_CSV
        return [f"Routes not measured in this measured folder ({where} is absent; benchmarks/h200_between_process.sh writes "
                "it): no route figure."]
    x = crossover(path, model=model)
    out = [route_sentence(path, model=model)]
    if x["median"] is not None:
        out.append(f"Padded sparse MQA would start to beat dense causal MHA ({model} TP8, cuDNN SDPA) at "
                   f"{x['median']:,} tokens [{x['lo']:,}, {x['hi']:,}] over processes: an extrapolation beyond the "
                   f"longest prompt measured ({x['measured_max']:,} tokens), fitted on each route's mean keys per "
                   "query.")
    else:
        out.append(f"Dense causal MHA stays ahead of padded sparse MQA up to the {x['measured_max']:,}-token prompts "
                   "measured, and the fitted lines do not cross below 1M tokens.")
    return out


def _rows(path):
    p = Path(path) if path else measured_dir("h200") / ROUTES_CSV
    if not p.exists():
        raise FileNotFoundError(f"routes rows {p} not found (benchmarks/h200_between_process.sh writes them)")
    return pd.read_csv(p)


def route_table(path: str | Path | None = None):
    """One row per (model, prompt_len, route): ``median_ms``, ``lo_ms``, ``hi_ms`` (over processes), ``n_processes``,
    ``equivalent`` (False: dense MHA above top-k), ``num_heads``, ``T``. Raises FileNotFoundError: no rows."""
    df = _rows(path)
    med = df.groupby(["model", "prompt_len", "route", "process"])["ms"].median().reset_index()
    meta = df.groupby("model")[["num_heads", "T"]].first()
    out = []
    for label, parts in ROUTE_LABELS.items():
        sel = med[med["route"].isin(parts)]
        summed = sel.groupby(["model", "prompt_len", "process"]).agg(ms=("ms", "sum"), n=("route", "nunique"))
        summed = summed[summed["n"] == len(parts)].reset_index()
        if summed.empty:
            continue
        summed["route"] = label
        for (model, L), v in between_process(summed, ["model", "prompt_len"]).items():
            dense = label.startswith("dense")
            out.append({"model": model, "prompt_len": int(L), "route": label, "median_ms": v["median"],
                        "lo_ms": v["lo"], "hi_ms": v["hi"], "n_processes": v["n_processes"],
                        "equivalent": (not dense) or int(L) <= 2048,
                        "num_heads": int(meta.loc[model, "num_heads"]), "T": int(meta.loc[model, "T"])})
    return pd.DataFrame(out).sort_values(["model", "route", "prompt_len"]).reset_index(drop=True)


def mean_keys(L: int, topk: int | None) -> float:
    """Mean keys per query of a causal prompt of ``L`` tokens: ``(L + 1) / 2`` (dense), or the mean of ``min(p + 1,
    topk)`` over positions (sparse top-k)."""
    if topk is None or L <= topk:
        return (L + 1) / 2
    return (topk * (topk + 1) / 2 + (L - topk) * topk) / L


def _totals(g, lens, label):
    parts = ROUTE_LABELS[label]
    sel = [g[(g["prompt_len"] == L) & g["route"].isin(parts)] for L in lens]
    return [float(s["ms"].sum()) if s["route"].nunique() == len(parts) else None for s in sel]


def _first_crossing(fd, fs, start, topk, max_len):
    """Smallest L >= start where the dense fit ``fd`` reaches the sparse fit ``fs`` (None below ``max_len``)."""
    def gap(L):
        return (fd.intercept + fd.slope * mean_keys(L, None)) - (fs.intercept + fs.slope * mean_keys(L, topk))

    lo, hi = start, start
    while hi <= max_len and gap(hi) < 0:
        lo, hi = hi, hi * 2
    if hi > max_len:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return hi


def crossover(path: str | Path | None = None, model: str = "glm-5", topk: int = 2048, max_len: int = 1 << 20) -> dict:
    """Prompt length (tokens) where padded sparse MQA would start to beat dense causal MHA, per process: each route
    fitted (least squares) as ``a + b mean_keys(L)``, the crossing the smallest ``L <= max_len`` where dense >=
    sparse (an extrapolation). Returns ``{"median", "lo", "hi", "n_processes", "per_process", "measured_max",
    "beyond_measured"}`` (None where no crossing)."""
    df = _rows(path)
    df = df[df["model"] == model]
    med = df.groupby(["prompt_len", "route", "process"])["ms"].median().reset_index()
    lens = sorted(int(x) for x in med["prompt_len"].unique())
    xs = []
    for _, g in med.groupby("process"):
        d, s = _totals(g, lens, _DENSE), _totals(g, lens, _SPARSE)
        if None in d or None in s:
            continue
        fd = linear_regression([mean_keys(L, None) for L in lens], d)
        fs = linear_regression([mean_keys(L, topk) for L in lens], s)
        xs.append(_first_crossing(fd, fs, lens[0], topk, max_len))
    found = sorted(x for x in xs if x is not None)
    mid = found[len(found) // 2] if len(found) == len(xs) and xs else None
    return {"median": mid, "lo": found[0] if found else None, "hi": found[-1] if len(found) == len(xs) and found
            else None, "n_processes": len(xs), "per_process": xs, "measured_max": lens[-1],
            "beyond_measured": mid is None or mid > lens[-1]}


def route_sentence(path: str | Path | None = None, model: str = "glm-5", prompt_len: int = 1024) -> str:
    """One plain sentence: the attention path per layer call at ``prompt_len`` on the dense route against the
    PR's padded path and the path before the PR (medians over processes, with [min, max])."""
    t = route_table(path)
    t = t[(t["model"] == model) & (t["prompt_len"] == prompt_len)].set_index("route")

    def f(label):
        r = t.loc[label]
        return f"{r.median_ms:.2f} ms [{r.lo_ms:.2f}, {r.hi_ms:.2f}]"

    return (f"{model}, {prompt_len}-token prompts in a {int(t['T'].iloc[0])}-token step, one H200 (measured, "
            f"{int(t['n_processes'].min())} fresh processes): attention path per layer call {f(_PRE)} before the PR, "
            f"{f(_SPARSE)} with it (the copy it removes), {f(_DENSE)} on the dense MHA route with the real heads "
            f"(the padding it never computes).")


def plot_routes(table=None):
    """Attention path per layer call vs prompt length, one panel per model, one line per route with its
    [min, max] over processes; dense MHA above top-k drawn dashed (not equivalent: a masked-MHA lower bound)."""
    t = route_table() if table is None else table
    models = list(dict.fromkeys(t["model"]))
    fig = new_figure((10.0, 3.8))
    axes = fig.subplots(1, len(models), squeeze=False)
    colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"]
    for ax, model in zip(axes[0], models):
        for (label, c) in zip(ROUTE_LABELS, colors):
            r = t[(t["model"] == model) & (t["route"] == label)]
            if r.empty:
                continue
            eq, neq = r[r["equivalent"]], r[~r["equivalent"]]
            ax.errorbar(eq["prompt_len"], eq["median_ms"], yerr=[eq["median_ms"] - eq["lo_ms"],
                        eq["hi_ms"] - eq["median_ms"]], color=c, marker="o", ms=3, capsize=2, label=label)
            if len(neq):
                tail = r[r["prompt_len"] >= eq["prompt_len"].max()]
                ax.plot(tail["prompt_len"], tail["median_ms"], color=c, ls="--", marker="x", ms=4)
        ax.axvline(2048, color="0.6", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        lens = sorted(t[t["model"] == model]["prompt_len"].unique())
        ax.set_xticks(lens, [str(int(x)) for x in lens])
        ax.minorticks_off()
        ax.set(xlabel="prompt length (tokens)", ylabel="ms per layer call")
        h = int(t[t["model"] == model]["num_heads"].iloc[0])
        ax.set_title(f"{model}, {h} heads per rank", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=7.5, frameon=False)
    fig.suptitle("Attention path per route (16384-token step, H200, median and [min, max] of 5 fresh processes; "
                 "dashed: dense above top-k = 2048, not equivalent)", fontsize=8.5)
    return fig
