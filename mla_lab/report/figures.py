"""The report's figures of sweep rows (matplotlib on :class:`matplotlib.figure.Figure`, no pyplot state): hollow
markers are modelled, filled ones measured. :func:`publish_figure` saves PNG + SVG and shows the PNG (what nbconvert
embeds in the HTML report)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from ..deployment import Deployment
from ..placement import BASELINE, PR_STRATEGY
from ..seed import SEED
from ..serving.benchmark import options_summary
from ..sweep.advise import frontier
from ..sweep.rows import NOT_PRICED, measured_change_pct
from .cache import publish_figure  # re-exported: the report publishes through it
from .data import DEPLOYMENT_KEYS, ok_rows, pick
from .layout_check import OVERLAP_PX, drawn, overlap
from .styles import STRATEGY_COLORS, STRATEGY_STYLE, strategy_style  # the one style table

__all__ = ["publish_figure", "plot_frontier_grid", "not_fitting", "kv_dtype_note", "plot_deployment", "plot_tp_bars",
           "plot_heatmap", "plot_validation", "STRATEGY_STYLE", "MODEL_STYLE", "STRATEGY_COLORS", "strategy_style",
           "model_style", "PR_STRATEGY", "new_figure"]


def _suptitle(fig, text: str, fontsize: float = 10.0) -> None:
    """A figure title wrapped to the figure's width (about 11 characters per inch at 10 pt)."""
    chars = max(20, int(fig.get_figwidth() * 11 * 10.0 / fontsize))
    fig.suptitle(textwrap.fill(text, width=chars), fontsize=fontsize)


def fits_mask(d):
    """True where a row's deployment fits in memory (``fits_in_memory`` True, or no such column; issue 22)."""
    if "fits_in_memory" not in d.columns:
        return pd.Series(True, index=d.index)
    return d["fits_in_memory"].map(lambda v: str(v).strip().lower() not in ("false", "0", "0.0"))


def _priced(d):
    """True where a row carries a TTFT number: status ok and its deployment fits (:func:`fits_mask`)."""
    ok = d["status"].fillna("ok") == "ok" if "status" in d.columns else fits_mask(d)
    return ok & fits_mask(d)


def new_figure(figsize):
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout="constrained")


def _short(row) -> str:
    m = str(row["model"]).replace("deepseek-v3.2", "DSV3.2").replace("glm-5", "GLM-5")
    L, mbt = int(row["prompt_len"]), int(row["max_num_batched_tokens"])
    k = lambda v: f"{v // 1024}k" if v % 1024 == 0 else str(v)  # noqa: E731
    return f"{m} TP{int(row['tp'])} {row['arch']} L{k(L)} B{k(mbt)} {row.get('kv_cache_dtype', '')}"


#: Colour and marker of every model, fixed across all reports (unknown models get the rest in name order).
MODEL_STYLE = {"glm-5": ("#d95f02", "o"), "glm-5.2": ("#e6ab02", "P"), "deepseek-v3.2": ("#7570b3", "s")}
_SPARE = [("#1b9e77", "^"), ("#e7298a", "D"), ("#66a61e", "v")]


def model_style(name: str, known=()) -> tuple[str, str]:
    """``(colour, marker)`` of a model name (fixed for the lab's models)."""
    if name in MODEL_STYLE:
        return MODEL_STYLE[name]
    others = sorted(m for m in set(known) | {name} if m not in MODEL_STYLE)
    return _SPARE[others.index(name) % len(_SPARE)]


def _deployment_rows(d):
    """``[(deployment dict, its rows)]`` grouped by :data:`DEPLOYMENT_KEYS`, in sorted order."""
    keys = [k for k in DEPLOYMENT_KEYS if k in d.columns]
    groups = d.groupby(keys, sort=True) if len(d) else []
    return [(dict(zip(keys, k if isinstance(k, tuple) else (k,))), g) for k, g in groups]


#: gid of the DP-attention point on a frontier panel (:func:`plot_deployment` ``dp_point``).
DP_POINT = "dp_attention_point"


def dp_attention_point(rows) -> dict | None:
    """The panel's deployment under SGLang's DP attention at ``dp = tp``, modelled
    (:func:`mla_lab.serving.benchmark.options_summary`): its ``extra_persistent_mib``, ``ttft_change_pct`` (vs without
    it) and heads; None when the rows do not name a whole deployment or it does not fit."""
    try:
        d = Deployment.from_point(rows.iloc[0].to_dict())
        d = d.replace(dp_attention=d.tp)
        o = options_summary(d, BASELINE)["dp_attention"]
    except (ValueError, KeyError):
        return None
    return {"extra_persistent_mib": o["extra_persistent_mib"],
            "ttft_change_pct": 100.0 * (o["ttft_ms"] - o["ttft_ms_without"]) / o["ttft_ms_without"],
            "heads_per_rank": o["heads_per_rank"]}


def _draw_dp_point(ax, p: dict, clip, stacked: int = 0) -> None:
    """The star at ``clip(ttft_change_pct)``; beyond the window its value is written (as the other off-scale points')
    inside the panel, past the ``stacked`` off-scale labels of that edge (:func:`_draw_off_scale`)."""
    x, real = p["extra_persistent_mib"], p["ttft_change_pct"]
    y = clip(real)
    ax.scatter([x], [y], marker="*", s=110, facecolors="none", edgecolors="black", linewidths=1.1, zorder=5, gid=DP_POINT)
    value = "" if y == real else f": {chr(0x25BC) if real < y else chr(0x25B2)} {real:+.1f} %"
    dy = -9 if y == real else 2 + 9 * stacked if real < y else -13 - 9 * stacked
    ax.annotate(f"DP attention, {p['heads_per_rank']} heads/rank (modelled){value}", (x, y), textcoords="offset points",
                xytext=(5, dy), va="baseline" if y == real else "bottom", fontsize=6.5, gid=DP_POINT)


def _by_source(d):
    """``(modelled rows, measured rows a figure may draw: ``measured_withheld`` empty, issue 39)`` of ``d``."""
    if "source" not in d.columns:
        return d, d.iloc[0:0]
    meas = d[d["source"] == "measured"]
    if "measured_withheld" in meas.columns:
        meas = meas[meas["measured_withheld"].fillna("").astype(str) == ""]
    return d[d["source"] != "measured"], meas


def _no_fit_panel(ax, rows) -> bool:
    """A deployment that does not fit: its reason on ``ax`` (True)."""
    if "fits_in_memory" not in rows.columns or bool(rows["fits_in_memory"].astype(bool).any()):
        return False
    reason = str(rows["fit_reason"].iloc[0]) if "fit_reason" in rows.columns else "does not fit"
    ax.text(0.5, 0.5, "does not fit:\n" + textwrap.fill(reason, width=38, max_lines=4, placeholder=" ..."),
            ha="center", va="center", transform=ax.transAxes, fontsize=8, color="#b00")
    ax.set_xticks([])
    ax.set_yticks([])
    return True


def _draw_subchunk_curves(ax, modelled) -> None:
    handoff = modelled["strategy"].str.extract(r"^subchunk:\d+(:views|:graph2)?$", expand=False)
    for family, end in (("subchunk", ""), ("subchunk_views", ":views"), ("subchunk_graph2", ":graph2")):
        sc = modelled[modelled["strategy"].str.startswith("subchunk:") & (handoff.fillna("") == end)]
        if not len(sc):
            continue
        sc = sc.drop_duplicates("strategy").sort_values("subchunk_rows")  # one label per S
        col = STRATEGY_STYLE[family][0]
        ax.plot(sc["extra_persistent_mib"], sc["ttft_change_pct"], "-", color=col, lw=1.0, alpha=0.8)
        for _, r in sc.iterrows():
            S = int(r["subchunk_rows"])
            ax.annotate(f"{S // 1024 or r['subchunk_rows']}{'k' if S >= 1024 else ''}",
                        (r["extra_persistent_mib"], r["ttft_change_pct"]), fontsize=6.5, color=col,
                        textcoords="offset points",  # plain above right, views below, graph2 above left
                        xytext={"": (3, 3), ":views": (3, -10), ":graph2": (-16, 3)}[end], gid=S_LABEL)


def _draw_points(ax, modelled, measured, clip) -> list:
    """Modelled points hollow, measured ones filled with their interval; returns ``(x, y, colour, filled)`` of
    those beyond the window."""
    off = []
    for _, r in modelled.iterrows():
        col, mk, _ = strategy_style(r["strategy"])
        y = r["ttft_change_pct"]
        if clip(y) != y:
            off.append((r["extra_persistent_mib"], y, col, False))
        ax.scatter([r["extra_persistent_mib"]], [clip(y)], marker=mk, s=42, facecolors="none",
                   edgecolors=col, linewidths=1.3, zorder=3)
    for _, r in measured.iterrows():
        col, mk, _ = strategy_style(r["strategy"])
        lo, hi, y = r.get("ttft_change_ci_lo"), r.get("ttft_change_ci_hi"), r["ttft_change_pct"]
        err = [[max(0.0, y - lo)], [max(0.0, hi - y)]] if lo == lo and hi == hi and None not in (lo, hi) else None
        if clip(y) != y:
            off.append((r["extra_persistent_mib"], y, col, True))
            y, err = clip(y), None
        ax.errorbar([r["extra_persistent_mib"]], [y], yerr=err, fmt=mk, color=col, mec="black", mew=0.7, ms=6.5,
                    capsize=2.5, zorder=4, elinewidth=1.0)
    return off


def _draw_frontier(ax, modelled, clip) -> None:
    """The Pareto staircase over the modelled strategies that fit, kernel_native left out."""
    fits = modelled[modelled["fits_in_memory"].astype(bool)] if "fits_in_memory" in modelled.columns else modelled
    fits = fits[fits["placement"] != "kernel_native"] if "placement" in fits.columns else fits
    if len(fits):
        front = fits[frontier(list(zip(fits["extra_persistent_mib"], fits["ttft_change_pct"])))]
        front = front.sort_values("extra_persistent_mib")
        ax.step(front["extra_persistent_mib"], [clip(y) for y in front["ttft_change_pct"]], where="post",
                color="#d62728", lw=1.2, alpha=0.7, zorder=2, gid=FRONTIER)


def _draw_off_scale(ax, window, off) -> None:
    """The window as the y range, each point beyond it labelled at its edge, stacked inward."""
    span = window[1] - window[0]
    ax.set_ylim(window[0] - 0.04 * span, window[1] + 0.04 * span)
    for top in (False, True):
        side = sorted((o for o in off if (o[1] > window[1]) == top), key=lambda o: o[0])
        x0, x1 = ax.get_xlim()
        arrow = "\u25b2" if top else "\u25bc"
        for rank, (x, y, col, filled) in enumerate(side):
            right = x > (x0 + x1) / 2
            ax.annotate(f"{arrow} {y:+.1f} %", (x, window[1] if top else window[0]), textcoords="offset points",
                        xytext=(-6 if right else 6, (-4 - 9 * rank) if top else (2 + 9 * rank)),
                        ha="right" if right else "left", va="top" if top else "bottom", fontsize=6.5, color=col,
                        gid=OFF_SCALE, fontweight="bold" if filled else "normal")


def plot_deployment(ax, rows, title: str | None = None, dp_point: dict | None = None) -> int:
    """One deployment's trade on ``ax``: each strategy at (persistent extra MiB per rank, TTFT change % vs
    :data:`mla_lab.placement.BASELINE`), the sub-chunk S curves, the Pareto frontier and ``dp_point``
    (:func:`dp_attention_point`); points beyond :func:`y_window` at its edge. Returns how many are off-scale."""
    ax.set_title(title or _short(rows.iloc[0]), fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)
    if _no_fit_panel(ax, rows):
        return 0
    modelled, measured = _by_source(rows)
    window = y_window(list(rows["ttft_change_pct"]) + ([dp_point["ttft_change_pct"]] if dp_point else []))
    clip = (lambda y: y) if window is None else (lambda y: min(max(y, window[0]), window[1]))  # noqa: E731
    _draw_subchunk_curves(ax, modelled)
    off = _draw_points(ax, modelled, measured, clip)
    _draw_frontier(ax, modelled, clip)
    if dp_point is not None:
        low = dp_point["ttft_change_pct"] < clip(dp_point["ttft_change_pct"])
        _draw_dp_point(ax, dp_point, clip, sum((o[1] < window[0]) == low for o in off))
    ax.axhline(0, color="k", lw=0.6)
    if window is not None:
        _draw_off_scale(ax, window, off)
    return len(off)


#: gid of the value labels of points beyond a frontier panel's y window (:func:`y_window`).
OFF_SCALE = "off_scale"
#: gid of a frontier panel's Pareto staircase.
FRONTIER = "frontier"


def y_window(values, fence: float = 3.0, squash: float = 2.0, min_iqr: float = 1.0):
    """``(lo, hi)`` of the values (NaN ignored) inside Tukey's far fences (``fence`` x IQR >= ``min_iqr`` %), holding
    0; None when nothing is outside them or the outliers widen the range by less than ``squash`` times."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if v.size < 4:
        return None
    q1, q3 = np.percentile(v, [25, 75])
    iqr = max(q3 - q1, min_iqr)
    inside = v[(v >= q1 - fence * iqr) & (v <= q3 + fence * iqr)]
    if inside.size == v.size or inside.size == 0:
        return None
    lo, hi = min(inside.min(), 0.0), max(inside.max(), 0.0)
    core = max(hi - lo, min_iqr)
    if (max(v.max(), 0.0) - min(v.min(), 0.0)) < squash * core:
        return None
    pad = 0.15 * core
    return lo - pad, hi + pad


#: Why an fp8 KV cache's rows look alike (issue 32).
FP8_KV_NOTE = "; with an fp8 KV cache no heads are padded, so the padded-Q strategies price alike"


def kv_dtype_note(df, shown: str | None, where: str = "the table at the end of the report and the CSV") -> str:
    """One line per KV-cache dtype of ``df`` that a view showing only ``shown`` leaves out (issue 32): its
    deployment points (modelled rows) and ``where`` they are; "" when ``shown`` is None or there is no other."""
    if shown is None or "kv_cache_dtype" not in getattr(df, "columns", ()) or not len(df):
        return ""
    d = df[df["source"] != "measured"] if "source" in df.columns else df
    d = d[d["kv_cache_dtype"].astype(str) != str(shown)]
    keys = [k for k in DEPLOYMENT_KEYS if k in d.columns]
    parts = []
    for dtype, g in d.groupby("kv_cache_dtype", sort=True):
        n = len(g.drop_duplicates(keys))
        parts.append(f"{dtype} KV rows: {n} deployment point{'s' if n != 1 else ''}, not drawn here (this view "
                     f"shows {shown} KV only); see {where}" + (FP8_KV_NOTE if str(dtype) == "fp8" else ""))
    return ". ".join(parts) + ("." if parts else "")


def not_fitting(df, kv_cache_dtype: str | None = "bf16"):
    """What ``df`` does not price (DataFrame: the deployment's columns, ``strategy``, ``status``, ``reason``): a
    deployment that does not fit (``does_not_fit``, ``strategy`` empty; older rows with ``fits_in_memory`` False
    too) and a strategy that tips a fitting one out of fitting (``tips_out``)."""
    d = _priced_or_not(df)
    if kv_cache_dtype and "kv_cache_dtype" in d.columns:
        d = d[d["kv_cache_dtype"] == kv_cache_dtype]
    if "source" in d.columns:
        d = d[d["source"] != "measured"]
    out = []
    for dep, rows in _deployment_rows(d):
        st = rows["status"].fillna("ok") if "status" in rows.columns else pd.Series("ok", index=rows.index)
        old = "fits_in_memory" in rows.columns and not bool(fits_mask(rows).any())
        if (st == "does_not_fit").any() or old:
            reason = rows["reason"][st == "does_not_fit"] if (st == "does_not_fit").any() else rows["fit_reason"]
            out.append({**dep, "strategy": "", "status": "does_not_fit", "reason": str(reason.iloc[0])})
            continue
        for _, r in rows[st == "tips_out"].drop_duplicates("strategy").iterrows():
            out.append({**dep, "strategy": r["strategy"], "status": "tips_out", "reason": str(r["reason"])})
    return pd.DataFrame(out, columns=[*(k for k in DEPLOYMENT_KEYS if k in d.columns), "strategy", "status", "reason"])


def _frontier_legend(fig, present, dp_attention: bool, width: float) -> None:
    from matplotlib.lines import Line2D

    labels = {strategy_style(s)[2] for s in present}
    handles = [Line2D([], [], ls="", marker=mk, markerfacecolor="none", markeredgecolor=col, markersize=7, label=label)
               for col, mk, label in STRATEGY_STYLE.values() if label in labels]
    handles += [Line2D([], [], ls="", marker="o", markerfacecolor="#999", markeredgecolor="black",
                       label="measured (interval)"),
                Line2D([], [], color="#d62728", lw=1.2, label="this deployment's Pareto frontier")]
    handles += [Line2D([], [], ls="", marker="*", markerfacecolor="none", markeredgecolor="black", markersize=9,
                       label="SGLang DP attention, dp = tp (modelled)")] if dp_attention else []
    fig.legend(handles=handles, loc="outside lower center", ncol=max(1, min(4, int(width / 3.2))), fontsize=7.5,
               frameon=False)


def _frontier_page(page, ncols: int, dp_attention: bool):
    """``(figure of the deployments of ``page`` as panels, width, number of off-scale points)``."""
    nc = min(ncols, len(page))
    nr = -(-len(page) // nc)
    width = max(7.0, 4.3 * nc)  # room for the legend and title even for one panel
    fig = new_figure((width, 3.3 * nr + 1.6))
    axes = fig.subplots(nr, nc, squeeze=False)
    n_off = sum(plot_deployment(ax, rows, dp_point=dp_attention_point(rows) if dp_attention else None)
                for ax, (_, rows) in zip(axes.flat, page))
    for ax in list(axes.flat)[len(page):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("TTFT change [%]", fontsize=8.5)
    for ax in axes[-1, :]:
        ax.set_xlabel("persistent extra MiB per rank", fontsize=8.5)
    return fig, width, n_off


def plot_frontier_grid(df, ncols: int = 3, per_page: int = 9, kv_cache_dtype: str | None = "bf16",
                       include_not_fitting: bool = False, dp_attention: bool = False) -> list:
    """Every deployment of ``df`` that fits (or all, ``include_not_fitting``) of ``kv_cache_dtype`` (None: all) as a
    panel (:func:`plot_deployment`), ``ncols`` wide, ``per_page`` per figure; ``dp_attention``: with
    :func:`dp_attention_point`. Returns the figures."""
    d = ok_rows(df)
    left_out = kv_dtype_note(d, kv_cache_dtype)
    if kv_cache_dtype and "kv_cache_dtype" in d.columns:
        d = d[d["kv_cache_dtype"] == kv_cache_dtype]
    deps = [(k, g) for k, g in _deployment_rows(d) if include_not_fitting or "fits_in_memory" not in g.columns
            or bool(g["fits_in_memory"].astype(bool).any())]
    figs = []
    for start in range(0, len(deps), per_page):
        fig, width, n_off = _frontier_page(deps[start:start + per_page], ncols, dp_attention)
        _frontier_legend(fig, set(d["strategy"]), dp_attention, width)
        title = ("Memory vs TTFT per deployment, changes vs vLLM before PR #53878 with zero padded heads"
                 f"{'' if len(deps) <= per_page else f' ({start // per_page + 1}/{-(-len(deps) // per_page)})'}")
        if n_off:
            title += (" | \u25b2/\u25bc: a point beyond its panel's y range (a route far from the rest), drawn at the "
                      "panel's edge with its TTFT change written beside it")
        _suptitle(fig, title + (f" | {left_out}" if left_out else ""))
        drop_colliding_labels(fig)
        figs.append(fig)
    return figs


#: gid of the sub-chunk S labels on the frontier panels (secondary: the ones that would collide are left out).
S_LABEL = "s_label"


def drop_colliding_labels(fig, gid: str = S_LABEL) -> None:
    """Remove every text of ``fig`` tagged ``gid`` that would print over a tick label or a text kept before it, so
    the figure passes :func:`mla_lab.report.layout_check.label_overlaps`."""
    with drawn(fig) as renderer:
        for ax in fig.axes:
            kept = [t.get_window_extent(renderer) for axis in (ax.xaxis, ax.yaxis)
                    for t in axis.get_ticklabels() if t.get_visible() and t.get_text().strip()]
            kept += [t.get_window_extent(renderer) for t in ax.texts if t.get_gid() != gid and t.get_text().strip()]
            for t in [t for t in ax.texts if t.get_gid() == gid]:
                bb = t.get_window_extent(renderer)
                if any(min(overlap(bb, k)) > OVERLAP_PX for k in kept):
                    t.remove()
                else:
                    kept.append(bb)


def _slice(d, kv_cache_dtype, max_num_batched_tokens=None):
    """``(rows of ``kv_cache_dtype``, the max_num_batched_tokens shown, the :func:`kv_dtype_note`)``; the value
    defaults to the seed's (else the largest in the data)."""
    left_out = kv_dtype_note(d, kv_cache_dtype)
    d = d[d["kv_cache_dtype"] == kv_cache_dtype] if "kv_cache_dtype" in d.columns else d
    return d, max_num_batched_tokens or pick(d["max_num_batched_tokens"], SEED["max_num_batched_tokens"]), left_out


def _no_fit_notes(ax, xs, tps, g, fit) -> None:
    for x, t in zip(xs, tps):
        if t in g.index and not bool(fit.get(t, True)):
            ax.text(x, 0, "does not fit", rotation=90, ha="center", va="bottom", fontsize=6.5, color="0.35")


def _fitting(g, col, tps):
    """``(values of ``col`` per TP, NaN where the row does not fit, the fit mask)``."""
    fit = fits_mask(g) if len(g) else g.index.to_series()
    return [g[col].get(t, float("nan")) if bool(fit.get(t, True)) else float("nan") for t in tps], fit


def _of(d, a, m, s):
    """The rows of ``d`` of arch ``a``, model ``m`` and strategy ``s``."""
    return d[(d["arch"] == a) & (d["model"] == m) & (d["strategy"] == s)]


def _tp_ttft_bars(ax, mod, meas, a, m, mi, nb, tps, col) -> None:
    """One model's TTFT-change bars (the PR's solid, kernel_native hatched) and its measured diamonds."""
    w = 0.8 / (2 * nb)
    for si, s in enumerate((PR_STRATEGY, "kernel_native")):
        g = _of(mod, a, m, s).set_index("tp")
        xs = [i + (mi * 2 + si - nb + 0.5) * w for i, _ in enumerate(tps)]
        vals, fit = _fitting(g, "ttft_change_pct", tps)
        bars = ax.bar(xs, vals, w, color=col if s == PR_STRATEGY else "white", edgecolor=col,
                      hatch=None if s == PR_STRATEGY else "///", linewidth=1.0)
        ax.bar_label(bars, labels=[("" if v != v else f"{v:+.1f}") for v in vals], fontsize=7, padding=2)
        _no_fit_notes(ax, xs, tps, g, fit)
        for t, gt in _of(meas, a, m, s).groupby("tp"):
            if t in g.index and bool(fit.get(t, True)):  # a measured share of a deployment that does not fit: none
                ax.plot(xs[tps.index(t)], measured_change_pct(gt), "D", markerfacecolor=col, markeredgecolor="black",
                        ms=6, zorder=4)


def _tp_memory_bars(ax, mod, a, m, mi, nb, tps, col) -> None:
    """One model's extra Q workspace of the PR per TP, labelled with MiB and % of KV capacity lost."""
    g = _of(mod, a, m, PR_STRATEGY).set_index("tp")
    xs = [i + (mi - (nb - 1) / 2) * (0.8 / nb) for i, _ in enumerate(tps)]
    vals, fit = _fitting(g, "extra_persistent_mib", tps)
    bars = ax.bar(xs, vals, 0.8 / nb, color=col)
    pct = [g["kv_capacity_pct_lost"].get(t, float("nan")) if "kv_capacity_pct_lost" in g.columns
           else float("nan") for t in tps]
    ax.bar_label(bars, labels=[("" if v != v else f"{v:.0f}" + ("" if p != p else f"\n{p:.1f} % KV"))
                               for v, p in zip(vals, pct)], fontsize=7, padding=2)
    _no_fit_notes(ax, xs, tps, g, fit)


def _tp_axes(ax_t, ax_m, a, mod, models, tps) -> None:
    """Ticks ``TP<n> / H=<heads per rank per model>``, grid, limits and titles of one arch's row."""
    first = mod[mod["arch"] == a].groupby(["tp", "model"])["num_heads"].first()
    heads = {t: "/".join(str(int(first[(t, m)])) for m in models if (t, m) in first.index) or "-" for t in tps}
    for ax in (ax_t, ax_m):
        ax.set_xlim(-0.5, len(tps) - 0.5)  # every TP's slot, with or without bars (a "does not fit" note)
        ax.set_xticks(range(len(tps)), [f"TP{t}\nH={heads[t]}" for t in tps], fontsize=8.5)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    ax_t.axhline(0, color="k", lw=0.6)
    lo, hi = ax_t.get_ylim()
    span = max(hi - lo, 1.0)
    ax_t.set_ylim(min(lo, 0) - 0.08 * span, max(hi, 0) + 0.1 * span)  # room for the value labels
    ax_t.set_ylabel("TTFT change vs baseline [%]")
    ax_t.set_title(f"{a}: TTFT change", fontsize=10)
    ax_m.set_ylabel("extra MiB per rank (vLLM #53878)\nlabel: MiB, % of KV capacity lost")
    ax_m.set_title(f"{a}: extra Q workspace of vLLM #53878", fontsize=10)
    ax_m.margins(y=0.15)


def plot_tp_bars(df, max_num_batched_tokens: int | None = None, prompt_len: int | None = None,
                 kv_cache_dtype: str = "bf16"):
    """Per TP size, one row per arch: TTFT change vs :data:`mla_lab.placement.BASELINE` of vLLM #53878 (solid) and
    kernel_native (hatched), measured as diamonds, and the PR's extra Q workspace per rank, coloured by model; at the
    seed's max_num_batched_tokens and prompt length (else the largest)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    d, mbt, left_out = _slice(ok_rows(df), kv_cache_dtype, max_num_batched_tokens)
    L = prompt_len or pick(d["prompt_len"], SEED["prompt_len"])
    d = d[(d["max_num_batched_tokens"] == mbt) & (d["prompt_len"] == L)]
    mod, meas = _by_source(d)
    archs = sorted(d["arch"].unique()) or ["-"]
    models = sorted(d["model"].unique())
    tps = sorted(set(mod["tp"]) | set(meas["tp"]))  # a TP only withheld measured rows hold has no slot (issue 39)
    fig = new_figure((12.5, 3.3 * len(archs) + 0.9))
    axes = fig.subplots(len(archs), 2, squeeze=False)
    nb = max(1, len(models))
    for (ax_t, ax_m), a in zip(axes, archs):
        for mi, m in enumerate(models):
            col = model_style(m, models)[0]
            _tp_ttft_bars(ax_t, mod, meas, a, m, mi, nb, tps, col)
            _tp_memory_bars(ax_m, mod, a, m, mi, nb, tps, col)
        _tp_axes(ax_t, ax_m, a, mod, models, tps)
    handles = [Patch(facecolor=model_style(m, models)[0], label=m) for m in models]
    handles += [Patch(facecolor="#999", edgecolor="#555", label="vLLM #53878 (modelled)"),
                Patch(facecolor="white", edgecolor="#555", hatch="///", label="kernel_native: real-head FlashMLA (modelled)"),
                Line2D([], [], ls="", marker="D", markerfacecolor="#999", markeredgecolor="black",
                       label="measured (model colour)")]
    ncol = max(1, min(len(handles), int(fig.get_figwidth() / 2.6)))  # about 2.6 inches per entry
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8.5, frameon=False)
    _suptitle(fig, f"Per TP size, {kv_cache_dtype} KV cache, max_num_batched_tokens {mbt}, "
                 f"{int(d['num_prompts'].iloc[0]) if len(d) and 'num_prompts' in d.columns else '?'} x {L}-token "
                 "prompts (H = heads per rank per model)" + (f" | {left_out}" if left_out else ""))
    return fig


def _priced_or_not(df):
    """Rows that are ok or a not-priced result (:data:`mla_lab.sweep.rows.NOT_PRICED`), not failures."""
    return df[df["status"].fillna("ok").isin(("ok", *NOT_PRICED))] if "status" in df.columns else df


def _heatmap_cells(mod, ykeys, Ls):
    """``(grid of the mean priced change, cells that do not fit, cells the strategy tips out of fitting)``."""
    grid = np.full((len(ykeys), len(Ls)), np.nan)
    nofit, tips = set(), set()
    for (h, m, L), g in mod.groupby(["num_heads", "model", "prompt_len"]):
        cell = (ykeys.index((int(h), m)), Ls.index(L))
        if "status" in g.columns and (g["status"].fillna("ok") == "tips_out").any():
            tips.add(cell)  # the deployment fits without this strategy, not with it: no TTFT number
        elif not _priced(g).any():  # no TTFT number for a deployment that cannot run
            nofit.add(cell)
        else:
            grid[cell] = g[_priced(g)]["ttft_change_pct"].mean()
    return grid, nofit, tips


def _heatmap_panel(ax, mod, meas, ykeys, Ls, norm, lim):
    """One arch's cells: the modelled value, ``m: x%`` where measured, or why there is none."""
    grid, nofit, tips = _heatmap_cells(mod, ykeys, Ls)
    im = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto")
    for i, (h, m) in enumerate(ykeys):
        for j, L in enumerate(Ls):
            v = grid[i, j]
            txt = ("does not fit" if (i, j) in nofit else "tips out\n(fits without it)" if (i, j) in tips
                   else "n/a" if v != v else f"{v:+.1f}%")
            mm = meas[(meas["num_heads"] == h) & (meas["model"] == m) & (meas["prompt_len"] == L)]
            if measured_change_pct(mm) is not None and (i, j) not in nofit | tips:
                txt += f"\nm: {measured_change_pct(mm):+.1f}%"
            dark = v == v and abs(v) > 0.6 * lim
            ax.text(j, i, txt, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    return im


def plot_heatmap(df, max_num_batched_tokens: int | None = None, strategy: str = PR_STRATEGY,
                 kv_cache_dtype: str = "bf16"):
    """TTFT change of ``strategy`` vs the baseline (%) over heads per rank x prompt length, one panel per arch, at one
    max_num_batched_tokens (the seed's, else the largest); modelled cells, a measured value added as ``m: x%``."""
    from matplotlib.colors import TwoSlopeNorm

    d, mbt, left_out = _slice(_priced_or_not(df), kv_cache_dtype, max_num_batched_tokens)
    d = d[(d["max_num_batched_tokens"] == mbt) & (d["strategy"] == strategy)]
    mod, meas = _by_source(d)
    archs = sorted(d["arch"].unique()) or ["-"]
    Ls = sorted(d["prompt_len"].unique())
    ykeys = sorted({(int(h), m) for h, m in zip(mod["num_heads"], mod["model"])})
    vals = mod[_priced(mod)]["ttft_change_pct"].abs()
    lim = float(vals.max()) if len(vals) and vals.max() > 0 else 1.0
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)
    fig = new_figure((max(4.8, 1.35 * len(Ls) + 2.6) * len(archs), 0.55 * max(1, len(ykeys)) + 1.9))
    axes = fig.subplots(1, len(archs), squeeze=False, sharey=True)[0]
    im = None
    for ax, a in zip(axes, archs):
        im = _heatmap_panel(ax, mod[mod["arch"] == a], meas[meas["arch"] == a], ykeys, Ls, norm, lim)
        ax.set_xticks(range(len(Ls)), [str(L) for L in Ls])
        ax.set_xlabel("prompt length [tokens]")
        ax.set_title(f"{a}", fontsize=10)
    axes[0].set_yticks(range(len(ykeys)), [f"H={h} ({m})" for h, m in ykeys])
    axes[0].set_ylabel("heads per rank")
    if im is not None:
        fig.colorbar(im, ax=list(axes), label="TTFT change [%]", shrink=0.9)  # the strategy: in the title
    _suptitle(fig, f"TTFT change of {strategy} vs baseline, {kv_cache_dtype} KV cache, max_num_batched_tokens {mbt} "
                 "(modelled; 'm:' = measured)" + (f" | {left_out}" if left_out else ""), fontsize=10.5)
    return fig

_OP_CLASS_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31"]

def plot_validation(v):
    """Predicted vs measured (log-log, in-sample fit): ops by class (left), whole layers (right); MAPE per group."""
    fig = new_figure((13, 5.6))
    ax_op, ax_layer = fig.subplots(1, 2)
    ins = v[v["split"] == "in_sample"]
    ops = ins[ins["level"] == "op"]
    for i, (cls, g) in enumerate(ops.groupby("op_class")):
        ax_op.scatter(g["measured_ms"], g["predicted_ms"], s=14, alpha=0.75,
                      color=_OP_CLASS_COLORS[i % len(_OP_CLASS_COLORS)],
                      label=f"{cls} (n={len(g)}, MAPE {g['ape_pct'].mean():.1f}%)")
    layers = ins[ins["level"].isin(["layer", "layer_graph", "layer_paired"])]
    for (lvl, run), g in layers.groupby(["level", "run"]):
        ax_layer.scatter(g["measured_ms"], g["predicted_ms"], s=22, alpha=0.8,
                         label=f"{lvl} [{run}] (n={len(g)}, MAPE {g['ape_pct'].mean():.1f}%)")
    for ax, title in ((ax_op, "per op (one rank, real shapes)"), (ax_layer, "whole decoder layer (one rank)")):
        vals = np.array([v for c in ax.collections for v in c.get_offsets().ravel()])
        lo, hi = (max(vals[vals > 0].min() * 0.7, 1e-4), vals.max() * 1.4) if vals.size else ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="measured [ms] (H200)", ylabel="predicted [ms] (TTFT model)",
               title=title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
    _suptitle(fig, "TTFT model vs H200 measurements (modelled vs measured; in-sample calibration)")
    return fig
