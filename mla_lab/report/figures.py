"""Charts and tables of sweep rows (matplotlib + pandas) for the published report. Every figure and table says
which points are measured and which modelled.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot, no global backend switch), so importing
this module never changes how a notebook shows its own plots. :func:`publish_figure` saves a figure as PNG and SVG
and shows the PNG in the notebook, which is what nbconvert embeds in the HTML report.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..seed import SEED
from .data import ok_rows, pick

__all__ = ["publish_figure", "pareto_front", "plot_memory_vs_ttft", "plot_tp_bars", "plot_heatmap",
           "plot_validation", "STRATEGY_COLORS", "MODEL_COLORS", "MODEL_MARKERS"]

_STRAT_COLORS = {"unfused": "#7f7f7f", "fused": "#1f77b4", "kernel_native": "#2ca02c"}

_MODEL_COLORS = ["#d95f02", "#7570b3", "#1b9e77", "#e7298a", "#66a61e", "#e6ab02"]

_MODEL_MARKERS = ["o", "s", "^", "D", "v", "P"]

STRATEGY_COLORS, MODEL_COLORS, MODEL_MARKERS = _STRAT_COLORS, _MODEL_COLORS, _MODEL_MARKERS


# --------------------------------------------------------------------------------------------------- figures
def _figure(figsize):
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout="constrained")

def publish_figure(fig, name: str, figure_dir: str | Path | None, dpi: int = 110, show: bool = True) -> dict:
    """Save ``fig`` as ``<figure_dir>/<name>.png`` and ``.svg`` and (``show``) display the PNG in the notebook.

    Returns ``{"png": path, "svg": path}`` (paths None when ``figure_dir`` is None: display only).
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    png = buf.getvalue()
    out = {"png": None, "svg": None}
    if figure_dir is not None:
        d = Path(figure_dir)
        d.mkdir(parents=True, exist_ok=True)
        out["png"] = d / f"{name}.png"
        out["png"].write_bytes(png)
        out["svg"] = d / f"{name}.svg"
        fig.savefig(out["svg"], format="svg")
    if show:
        from IPython.display import Image, display

        display(Image(data=png, format="png"))
    return out

def pareto_front(x, y) -> list[bool]:
    """Mask of the points no other point dominates when both ``x`` and ``y`` are to be minimised (a point is
    dominated by one with x' <= x and y' <= y, one of them strictly). Ties keep every copy. NaN is never on it."""
    pts = list(zip(list(x), list(y)))
    mask = []
    for i, (xi, yi) in enumerate(pts):
        if xi != xi or yi != yi:
            mask.append(False)
            continue
        dom = any((xj <= xi and yj <= yi and (xj < xi or yj < yi)) for j, (xj, yj) in enumerate(pts)
                  if j != i and xj == xj and yj == yj)
        mask.append(not dom)
    return mask

def _short(row) -> str:
    m = str(row["model"]).replace("deepseek-v3.2", "DSV3.2").replace("glm-5", "GLM-5")
    L = int(row["prompt_len"])
    mbt = int(row["max_num_batched_tokens"])
    k = lambda v: f"{v // 1024}k" if v % 1024 == 0 else str(v)  # noqa: E731
    return f"{m} TP{int(row['tp'])} L{k(L)} B{k(mbt)}"

def plot_memory_vs_ttft(df, x: str = "extra_persistent_mib", y: str = "ttft_change_pct", kv_cache_dtype="bf16",
                        title: str | None = None, frontier_strategies=("unfused", "fused")):
    """Scatter of extra Q workspace per rank (x, MiB vs unfused) against TTFT change vs unfused (y, %), one panel
    per arch; colour = strategy, marker = model, hollow = modelled, filled = measured. The Pareto frontier (least
    memory for a given TTFT change) over the ``frontier_strategies`` points is drawn as a step line and its points
    are ringed and labelled (model, TP, prompt length L, max_num_batched_tokens B). ``kernel_native`` is left off
    the frontier by default: it is a modelled bound for a kernel that does not exist. Points that need no padding
    (``q_concat_heads == num_heads``: both strategies run the same code) enter the frontier at 0 % change, since a
    measured difference there is noise.

    Returns the matplotlib Figure.
    """
    from matplotlib.lines import Line2D

    d = ok_rows(df)
    if "kv_cache_dtype" in d.columns and kv_cache_dtype:
        d = d[d["kv_cache_dtype"] == kv_cache_dtype]
    d = d.dropna(subset=[x, y])
    archs = sorted(d["arch"].dropna().unique()) or ["-"]
    models = sorted(d["model"].dropna().unique())
    fig = _figure((6.4 * len(archs), 5.6))
    axes = fig.subplots(1, len(archs), squeeze=False, sharey=True)[0]
    for ax, a in zip(axes, archs):
        sub = d[d["arch"] == a]
        src = sub["source"] if "source" in sub.columns else None
        for (s, m), g in sub.groupby(["strategy", "model"]):
            mk = _MODEL_MARKERS[models.index(m) % len(_MODEL_MARKERS)]
            col = _STRAT_COLORS.get(s, "k")
            meas = (g["source"] == "measured") if src is not None else g[x] != g[x]
            ax.scatter(g.loc[~meas, x], g.loc[~meas, y], marker=mk, s=40, facecolors="none", edgecolors=col,
                       linewidths=1.3, zorder=3)
            if meas.any():
                ax.scatter(g.loc[meas, x], g.loc[meas, y], marker=mk, s=52, facecolors=col, edgecolors="black",
                           linewidths=0.8, zorder=4)
        fr = sub[sub["strategy"].isin(frontier_strategies)].copy()
        if {"q_concat_heads", "num_heads"} <= set(fr.columns):
            # where no padding is needed the two strategies run the same code: a measured difference there is
            # run-to-run noise, not a gain, so such points enter the frontier at the baseline
            fr.loc[fr["q_concat_heads"] == fr["num_heads"], y] = 0.0
        if len(fr):
            mask = pareto_front(fr[x], fr[y])
            front = fr[mask].sort_values([x, y])
            front = front.drop_duplicates(subset=[x, y])
            ax.step(front[x], front[y], where="post", color="#d62728", lw=1.4, zorder=2, alpha=0.9)
            ax.scatter(front[x], front[y], s=150, facecolors="none", edgecolors="#d62728", linewidths=1.6, zorder=5)
            keys = []
            for _, r in front.iterrows():
                if r[x] == 0 and r[y] == 0:
                    continue  # the unfused baseline: every config's unfused point sits at (0, 0)
                k = len(keys) + 1
                ax.annotate(str(k), (r[x], r[y]), textcoords="offset points", xytext=(7, 5 if k % 2 else -13),
                            fontsize=8.5, fontweight="bold", color="#d62728")
                src_tag = " (measured)" if str(r.get("source", "")) == "measured" else ""
                keys.append(f"{k}: {_short(r)}{src_tag}")
        else:
            keys = []
        ax.axhline(0, color="k", lw=0.6)
        pad = sub["prefill_padding"].dropna() if "prefill_padding" in sub.columns else []
        ax.set_title(f"{a} (prefill_padding {int(pad.iloc[0]) if len(pad) else '?'})")
        label = "extra Q workspace per rank vs unfused [MiB]"
        if keys:  # the frontier's configurations, numbered as on the plot (L prompt length, B batched tokens)
            lines = ["   ".join(keys[i:i + 2]) for i in range(0, len(keys), 2)]
            label += "\nPareto frontier:  " + "\n".join(lines)
        ax.set_xlabel(label, fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_ylabel("TTFT change vs unfused [%]")
    handles = [Line2D([], [], ls="", marker="s", markersize=9, markerfacecolor=c, markeredgecolor=c, label=s)
               for s, c in _STRAT_COLORS.items() if s in set(d["strategy"])]
    handles += [Line2D([], [], ls="", marker=_MODEL_MARKERS[i % len(_MODEL_MARKERS)], markersize=8,
                       markerfacecolor="none", markeredgecolor="k", label=m) for i, m in enumerate(models)]
    handles += [Line2D([], [], ls="", marker="o", markersize=8, markerfacecolor="none", markeredgecolor="k",
                       label="modelled (hollow)"),
                Line2D([], [], ls="", marker="o", markersize=8, markerfacecolor="k", markeredgecolor="k",
                       label="measured (filled)"),
                Line2D([], [], color="#d62728", marker="o", markerfacecolor="none", markersize=10,
                       label=f"Pareto frontier ({' + '.join(frontier_strategies)})")]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(5, len(handles)), fontsize=8.5, frameon=False)
    fig.suptitle(title or f"Memory vs TTFT per strategy and architecture ({kv_cache_dtype} KV cache)")
    return fig

def plot_tp_bars(df, max_num_batched_tokens: int | None = None, prompt_len: int | None = None,
                 kv_cache_dtype: str = "bf16"):
    """Per TP size: TTFT change vs unfused (fused solid, kernel_native hatched) and extra Q workspace per rank of
    fused, one row per arch, bars coloured by model. Modelled bars; measured values of the same cells are black
    diamonds. The slice shown defaults to the seed's max_num_batched_tokens 16384 and prompt length 1024 (else the
    largest in the data); the title says which."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    d = ok_rows(df)
    d = d[d["kv_cache_dtype"] == kv_cache_dtype] if "kv_cache_dtype" in d.columns else d
    mbt = max_num_batched_tokens or pick(d["max_num_batched_tokens"], SEED["max_num_batched_tokens"])
    L = prompt_len or pick(d["prompt_len"], SEED["prompt_len"])
    d = d[(d["max_num_batched_tokens"] == mbt) & (d["prompt_len"] == L)]
    src = d["source"] if "source" in d.columns else None
    mod = d[src != "measured"] if src is not None else d
    meas = d[src == "measured"] if src is not None else d.iloc[0:0]
    archs = sorted(d["arch"].unique()) or ["-"]
    models = sorted(d["model"].unique())
    tps = sorted(d["tp"].unique())
    fig = _figure((12.5, 3.3 * len(archs) + 0.9))
    axes = fig.subplots(len(archs), 2, squeeze=False)
    nb = max(1, len(models))
    w = 0.8 / (2 * nb)
    for row, a in enumerate(archs):
        ax_t, ax_m = axes[row]
        for mi, m in enumerate(models):
            col = _MODEL_COLORS[mi % len(_MODEL_COLORS)]
            for si, s in enumerate(("fused", "kernel_native")):
                g = mod[(mod["arch"] == a) & (mod["model"] == m) & (mod["strategy"] == s)].set_index("tp")
                xs = [i + (mi * 2 + si - nb + 0.5) * w for i, _ in enumerate(tps)]
                vals = [g["ttft_change_pct"].get(t, float("nan")) for t in tps]
                bars = ax_t.bar(xs, vals, w, color=col if s == "fused" else "white", edgecolor=col,
                                hatch=None if s == "fused" else "///", linewidth=1.0)
                ax_t.bar_label(bars, labels=[("" if v != v else f"{v:.0f}") for v in vals], fontsize=7, padding=2)
                gm = meas[(meas["arch"] == a) & (meas["model"] == m) & (meas["strategy"] == s)]
                for t, v in gm.groupby("tp")["ttft_change_pct"].median().items():
                    ax_t.plot(xs[tps.index(t)], v, "D", markerfacecolor=col, markeredgecolor="black", ms=6,
                              zorder=4)
            g = mod[(mod["arch"] == a) & (mod["model"] == m) & (mod["strategy"] == "fused")].set_index("tp")
            xs = [i + (mi - (nb - 1) / 2) * (0.8 / nb) for i, _ in enumerate(tps)]
            vals = [g["extra_persistent_mib"].get(t, float("nan")) for t in tps]
            bars = ax_m.bar(xs, vals, 0.8 / nb, color=col)
            ax_m.bar_label(bars, labels=[("" if v != v else f"{v:.0f}") for v in vals], fontsize=7.5, padding=2)
        heads = {}
        for m in models:
            gg = mod[(mod["arch"] == a) & (mod["model"] == m)]
            for t in tps:
                h = gg[gg["tp"] == t]["num_heads"]
                if len(h):
                    heads.setdefault(t, []).append(str(int(h.iloc[0])))
        labels = [f"TP{t}\nH={'/'.join(heads.get(t, ['-']))}" for t in tps]
        for ax in (ax_t, ax_m):
            ax.set_xticks(range(len(tps)), labels, fontsize=8.5)
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
        ax_t.axhline(0, color="k", lw=0.6)
        lo, hi = ax_t.get_ylim()
        span = max(hi - lo, 1.0)
        ax_t.set_ylim(min(lo, 0) - 0.08 * span, max(hi, 0) + 0.1 * span)  # room for the value labels
        ax_t.set_ylabel("TTFT change vs unfused [%]")
        ax_t.set_title(f"{a}: TTFT change", fontsize=10)
        ax_m.set_ylabel("extra MiB per rank (fused)")
        ax_m.set_title(f"{a}: extra Q workspace of fused", fontsize=10)
        ax_m.margins(y=0.15)
    handles = [Patch(facecolor=_MODEL_COLORS[i % len(_MODEL_COLORS)], label=m) for i, m in enumerate(models)]
    handles += [Patch(facecolor="#999", edgecolor="#555", label="fused (modelled)"),
                Patch(facecolor="white", edgecolor="#555", hatch="///", label="kernel_native (modelled bound)"),
                Line2D([], [], ls="", marker="D", markerfacecolor="#999", markeredgecolor="black",
                       label="measured (model colour)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8.5, frameon=False)
    fig.suptitle(f"Per TP size, {kv_cache_dtype} KV cache, max_num_batched_tokens {mbt}, "
                 f"{int(d['num_prompts'].iloc[0]) if len(d) and 'num_prompts' in d.columns else '?'} x {L}-token "
                 "prompts (H = heads per rank per model)")
    return fig

def plot_heatmap(df, max_num_batched_tokens: int | None = None, strategy: str = "fused",
                 kv_cache_dtype: str = "bf16"):
    """Heatmap of TTFT change of ``strategy`` vs unfused (%) over heads per rank (rows, labelled with the model)
    x prompt length (columns), one panel per arch, at one max_num_batched_tokens (default 16384, else the largest).
    Cells show the modelled value; a measured value of the same cell is added as ``m: x%``."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    d = ok_rows(df)
    d = d[d["kv_cache_dtype"] == kv_cache_dtype] if "kv_cache_dtype" in d.columns else d
    mbt = max_num_batched_tokens or pick(d["max_num_batched_tokens"], SEED["max_num_batched_tokens"])
    d = d[(d["max_num_batched_tokens"] == mbt) & (d["strategy"] == strategy)]
    src = d["source"] if "source" in d.columns else None
    mod = d[src != "measured"] if src is not None else d
    meas = d[src == "measured"] if src is not None else d.iloc[0:0]
    archs = sorted(d["arch"].unique()) or ["-"]
    Ls = sorted(d["prompt_len"].unique())
    ykeys = sorted({(int(h), m) for h, m in zip(mod["num_heads"], mod["model"])})
    vals = mod["ttft_change_pct"].abs()
    lim = float(vals.max()) if len(vals) and vals.max() > 0 else 1.0
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)
    fig = _figure((max(4.8, 1.35 * len(Ls) + 2.6) * len(archs), 0.55 * max(1, len(ykeys)) + 1.9))
    axes = fig.subplots(1, len(archs), squeeze=False, sharey=True)[0]
    im = None
    for ax, a in zip(axes, archs):
        grid = np.full((len(ykeys), len(Ls)), np.nan)
        for (h, m, L), g in mod[mod["arch"] == a].groupby(["num_heads", "model", "prompt_len"]):
            grid[ykeys.index((int(h), m)), Ls.index(L)] = g["ttft_change_pct"].mean()
        im = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto")
        for i, (h, m) in enumerate(ykeys):
            for j, L in enumerate(Ls):
                v = grid[i, j]
                txt = "n/a" if v != v else f"{v:+.1f}%"
                mm = meas[(meas["arch"] == a) & (meas["num_heads"] == h) & (meas["model"] == m)
                          & (meas["prompt_len"] == L)]["ttft_change_pct"]
                if len(mm):
                    txt += f"\nm: {mm.median():+.1f}%"
                dark = v == v and abs(v) > 0.6 * lim
                ax.text(j, i, txt, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_xticks(range(len(Ls)), [str(L) for L in Ls])
        ax.set_xlabel("prompt length [tokens]")
        ax.set_title(f"{a}", fontsize=10)
    axes[0].set_yticks(range(len(ykeys)), [f"H={h} ({m})" for h, m in ykeys])
    axes[0].set_ylabel("heads per rank")
    if im is not None:
        fig.colorbar(im, ax=list(axes), label=f"TTFT change of {strategy} vs unfused [%]", shrink=0.9)
    fig.suptitle(f"TTFT change of {strategy} vs unfused, {kv_cache_dtype} KV cache, max_num_batched_tokens {mbt} "
                 "(modelled; 'm:' = measured)", fontsize=10.5)
    return fig

_OP_CLASS_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31"]

def plot_validation(v):
    """Predicted vs measured (log-log, in-sample fit): ops coloured by class (left), whole layers (right: eager,
    CUDA graph, interleaved pairs). The diagonal is a perfect model; MAPE per group in the legend."""
    import numpy as np

    fig = _figure((13, 5.6))
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
        lo, hi = ax.get_xlim()[0], ax.get_xlim()[1]
        vals = np.array([c for c in ax.collections for c in c.get_offsets().ravel()]) if ax.collections else None
        if vals is not None and vals.size:
            lo, hi = max(vals[vals > 0].min() * 0.7, 1e-4), vals.max() * 1.4
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured [ms] (H200)")
        ax.set_ylabel("predicted [ms] (TTFT model)")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("TTFT model vs H200 measurements (modelled vs measured; in-sample calibration)")
    return fig
