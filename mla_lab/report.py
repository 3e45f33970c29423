"""Charts and tables of sweep rows (matplotlib + pandas) for the published report. Every figure and table says
which points are measured and which modelled.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot, no global backend switch), so importing
this module never changes how a notebook shows its own plots. :func:`publish_figure` saves a figure as PNG and SVG
and shows the PNG in the notebook, which is what nbconvert embeds in the HTML report.
"""

from __future__ import annotations

import html as _html
import io
import json
from pathlib import Path

__all__ = ["plot_memory_vs_ttft", "plot_tp_bars", "plot_heatmap", "pareto_front", "seed_setup_table",
           "summary_table", "summary_html", "html_table", "provenance_banner", "provenance_html", "provenance_summary", "load_measured",
           "failed_points", "publish_figure", "save_provenance", "combine", "measured_for", "pick", "SEED", "SEED_REPORTED"]

REPO = Path(__file__).resolve().parent.parent
_STRAT_COLORS = {"unfused": "#7f7f7f", "fused": "#1f77b4", "kernel_native": "#2ca02c"}
_MODEL_COLORS = ["#d95f02", "#7570b3", "#1b9e77", "#e7298a", "#66a61e", "#e6ab02"]
_MODEL_MARKERS = ["o", "s", "^", "D", "v", "P"]
# Columns a measured file must have to be read as sweep rows.
_SWEEP_COLUMNS = {"model", "tp", "arch", "strategy", "source", "max_num_batched_tokens", "prompt_len", "ttft_ms"}
_PROV_KEYS = ("device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit")

# The seed setup: vLLM PR #53878's benchmark (FACTS.md section 1).
SEED = {"model": "glm-5", "tp": 8, "arch": "h200", "max_num_batched_tokens": 16384, "prompt_len": 1024,
        "kv_cache_dtype": "bf16", "num_prompts": 32, "concurrency": 32}
SEED_REPORTED = {"ttft_change_pct": -9.5, "throughput_change_pct": 6.0, "peak_mib_before": 131753,
                 "peak_mib_after": 132785, "extra_peak_mib": 1032, "analytic_extra_bytes": 1_056_964_608}


# ----------------------------------------------------------------------------------------------------- data
def load_measured(root: str | Path | None = None, pattern: str = "*.csv", weight_dtype: str | None = None,
                  moe_parallel: str | None = None):
    """Measured sweep rows under ``data/measured`` (recursively): every ``pattern`` file that has the sweep's
    columns (model, tp, arch, strategy, source, max_num_batched_tokens, prompt_len, ttft_ms), keeping rows whose
    ``source`` is ``measured``; a ``file`` column says where each row came from. Other CSVs there (kernel
    benchmarks) are ignored. TTFT columns are re-derived with the current TTFT model around the measured attention
    path (:func:`mla_lab.bench.recompute_measured_ttft`). Empty DataFrame if none. ``root`` defaults to env ``MLA_LAB_MEASURED``, else the
    repository's ``data/measured``."""
    import os

    import pandas as pd

    root = Path(root) if root else Path(os.environ.get("MLA_LAB_MEASURED") or REPO / "data" / "measured")
    frames = []
    for p in sorted(root.rglob(pattern)) if root.is_dir() else []:
        try:
            df = pd.read_csv(p)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
            continue
        if not _SWEEP_COLUMNS <= set(df.columns):
            continue
        df = df[df["source"] == "measured"].copy()
        if len(df):
            df["file"] = str(p.relative_to(root))
            frames.append(df)
    if not frames:
        return pd.DataFrame()
    from .bench import recompute_measured_ttft

    # the attention path is measured; the rest of TTFT comes from the current model, so re-derive it here
    return recompute_measured_ttft(pd.concat(frames, ignore_index=True), weight_dtype, moe_parallel)


def measured_for(params, root: str | Path | None = None):
    """:func:`load_measured` rows that lie on the sweep grid of ``params`` (a :class:`mla_lab.sweep.SweepParams`):
    same models, TP sizes, archs (aliases resolved), max_num_batched_tokens, prompt lengths and KV-cache dtypes."""
    from .arch import get_arch

    m = load_measured(root, weight_dtype=params.weight_dtype, moe_parallel=params.moe_parallel)
    if len(m) == 0:
        return m
    keep = {"model": set(params.models), "tp": set(params.tp_sizes),
            "arch": {get_arch(a).name for a in params.archs},
            "max_num_batched_tokens": set(params.max_num_batched_tokens), "prompt_len": set(params.prompt_lens),
            "kv_cache_dtype": set(params.kv_cache_dtype)}
    for k, allowed in keep.items():
        if k in m.columns:
            m = m[m[k].astype(str).isin({str(v) for v in allowed})]
    return m.reset_index(drop=True)


def combine(modelled, measured=None):
    """The sweep's rows and measured rows in one frame (measured may be None or empty). A measured row that the
    sweep already holds (same point_key, strategy, source and timestamp: e.g. a committed copy of this very run) is
    kept once."""
    import pandas as pd

    if measured is None or len(measured) == 0:
        return modelled.copy()
    both = pd.concat([modelled, measured], ignore_index=True)
    key = [c for c in ("point_key", "strategy", "source", "timestamp") if c in both.columns]
    if len(key) == 4:
        both = both.drop_duplicates(subset=key, keep="first").reset_index(drop=True)
    return both


def _ok(df):
    return df[df["status"].fillna("ok") == "ok"] if "status" in df.columns else df


def pick(values, preferred):
    """``preferred`` if it is among ``values``, else the largest value (used to choose the slice a chart shows)."""
    vals = sorted({v for v in values if v == v})
    if not vals:
        return None
    return preferred if preferred in vals else vals[-1]


def failed_points(df):
    """Rows of points that failed (status != ok), with their reason."""
    if "status" not in df.columns:
        return df.iloc[0:0]
    cols = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "source",
                        "status", "reason") if c in df.columns]
    return df[df["status"].fillna("ok") != "ok"][cols]


# ----------------------------------------------------------------------------------------------- provenance
def _uniq(g, col) -> list[str]:
    if col not in g.columns:
        return []
    return sorted({str(v) for v in g[col].dropna().unique() if str(v) not in ("", "nan")})


def provenance_summary(df) -> dict:
    """Per source (``measured``/``modelled``): row count, devices and software, commits, time range, and for modelled
    rows the TTFT scope, calibration and arch cards. JSON-serialisable (it goes into the report index)."""
    out = {"rows": int(len(df)) if df is not None else 0, "sources": {}}
    if df is None or len(df) == 0 or "source" not in df.columns:
        return out
    for src, g in df.groupby("source"):
        s = {"rows": int(len(g))}
        for k in _PROV_KEYS + ("code_version", "file"):
            v = _uniq(g, k)
            if v:
                s[k] = v
        ts = _uniq(g, "timestamp")
        if ts:
            s["time_range"] = [ts[0], ts[-1]]
        if src == "modelled":
            for k in ("ttft_scope", "calibration", "model_arch"):
                v = _uniq(g, k)
                if v:
                    s[k] = v
        s["archs"] = _uniq(g, "arch")
        s["models"] = _uniq(g, "model")
        out["sources"][str(src)] = s
    return out


def provenance_banner(df) -> str:
    """One Markdown paragraph: how many rows are measured (on which GPU/software/commit) and how many modelled."""
    summ = provenance_summary(df)
    if not summ["sources"]:
        return "**No rows.**"
    parts = []
    for src, s in summ["sources"].items():
        desc = ", ".join(f"{k}={'/'.join(s[k])}" for k in ("device", "driver", "torch", "triton", "flash_mla",
                                                              "git_commit") if k in s)
        extra = ""
        if src == "modelled":
            extra = (f" TTFT scope: {', '.join(s.get('ttft_scope', []))}; calibration: "
                     f"{', '.join(s.get('calibration', []))}.")
        parts.append(f"**{src}**: {s['rows']} rows ({desc}).{extra}")
    return " ".join(parts)


def provenance_html(df, run_id: str | None = None) -> str:
    """The report's provenance banner (HTML): which rows are measured, on what GPU and software at which commit;
    which are modelled, by which TTFT model and calibration."""
    summ = provenance_summary(df)
    e = _html.escape

    def line(s, keys, named=False):
        return "; ".join((f"{k} " if named else "") + f"<code>{e(', '.join(s[k]))}</code>" for k in keys if k in s)

    src = summ["sources"]
    rows = []
    if "measured" in src:
        m = src["measured"]
        rows.append(f"<li><b>Measured: {m['rows']} rows</b> (filled markers) on "
                    f"{line(m, ('device', 'sm', 'driver', 'cuda', 'torch', 'triton', 'flash_mla'), named=True)}; "
                    f"commit {line(m, ('git_commit',))}; time {e(' .. '.join(m.get('time_range', [])))}; "
                    f"files {line(m, ('file',))}.</li>")
    else:
        rows.append("<li><b>Measured: none.</b> No measured rows under <code>data/measured/</code> match this grid; "
                    "every TTFT below is modelled. Running the sweep on a GPU (device=auto) adds measured rows.</li>")
    if "modelled" in src:
        m = src["modelled"]
        bits = [f"<b>Modelled: {m['rows']} rows</b> (hollow markers). Memory: exact bytes "
                "(<code>mla_lab.buffers.memory_account</code>). TTFT: <code>mla_lab.ttft.predict_ttft</code>"]
        if "ttft_scope" in m:
            bits.append(f", scope {line(m, ('ttft_scope',))}")
        if "calibration" in m:
            bits.append(f"; calibration {line(m, ('calibration',))}")
        bits.append(f"; arch cards {line(m, ('archs',))} (datasheet rates; non-H200 cards reuse the H200 "
                    "efficiencies).")
        where = line(m, ("device", "torch"), named=True)
        if where:
            bits.append(f" Computed on {where}")
        if "git_commit" in m:
            bits.append(f" at commit {line(m, ('git_commit',))}")
        if "code_version" in m:
            bits.append(f", code version {line(m, ('code_version',))}")
        if m.get("time_range"):
            bits.append(f", {e(' .. '.join(m['time_range']))}")
        rows.append("<li>" + "".join(bits) + ".</li>")
    for other in sorted(set(src) - {"measured", "modelled"}):
        rows.append(f"<li><b>{e(other)}: {src[other]['rows']} rows</b>.</li>")
    rid = f" &middot; run <code>{e(run_id)}</code>" if run_id else ""
    return ("<div style='border:2px solid #1f77b4;border-radius:6px;padding:8px 14px;background:#f3f8fd;"
            f"margin:8px 0'><b>Provenance</b>{rid}<ul style='margin:4px 0'>{''.join(rows)}</ul></div>")


def save_provenance(df, figure_dir: str | Path, **extra) -> Path:
    """Write :func:`provenance_summary` (plus ``extra``) to ``<figure_dir>/provenance.json`` for the report index."""
    d = Path(figure_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / "provenance.json"
    p.write_text(json.dumps({**provenance_summary(df), **extra}, indent=1, default=str))
    return p


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

    d = _ok(df)
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

    d = _ok(df)
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

    d = _ok(df)
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


# ---------------------------------------------------------------------------------------------------- tables
def seed_setup_table(df=None, measured=None):
    """The seed's setup (vLLM PR #53878 benchmark: GLM-5 TP8, Hopper, bf16 KV cache, max_num_batched_tokens 16384,
    32 prompts x 1024 tokens at concurrency 32): reported numbers beside ours.

    Ours (modelled) comes from ``df`` when it holds the seed point, else it is priced now with
    :func:`mla_lab.sweep.price_point`; ours (measured) from matching measured rows, if any.
    """
    import pandas as pd

    def sel(d):
        if d is None or len(d) == 0:
            return d.iloc[0:0] if d is not None else None
        d = _ok(d)
        for k in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "num_prompts"):
            if k in d.columns:
                d = d[d[k].astype(str) == str(SEED[k])]
        return d

    mod = sel(df)
    if mod is not None and "source" in mod.columns:
        mod = mod[mod["source"] != "measured"]
    if mod is None or len(mod) == 0 or not {"fused", "unfused"} <= set(mod["strategy"]):
        from .sweep import price_point

        mod = pd.DataFrame(price_point({**SEED, "strategies": ["unfused", "fused", "kernel_native"]}))
    meas = sel(measured)
    if meas is not None and "source" in meas.columns:
        meas = meas[meas["source"] == "measured"]

    def val(d, s, col):
        if d is None or len(d) == 0 or col not in d.columns:
            return None
        v = d[d["strategy"] == s][col].dropna()
        return float(v.median()) if len(v) else None

    def f(v, fmt):
        return "-" if v is None else fmt.format(v)

    scope = ", ".join(map(str, mod["ttft_scope"].dropna().unique())) if "ttft_scope" in mod.columns else "?"
    t_f, t_k = val(mod, "fused", "ttft_change_pct"), val(mod, "kernel_native", "ttft_change_pct")
    x_b = val(mod, "fused", "extra_persistent_bytes")
    rep = SEED_REPORTED
    wd = str(mod["weight_dtype"].iloc[0]) if "weight_dtype" in mod.columns else "fp8"
    mp = str(mod["moe_parallel"].iloc[0]) if "moe_parallel" in mod.columns else "ep"
    pk_u, pk_f = val(meas, "unfused", "measured_peak_extra_bytes"), val(meas, "fused", "measured_peak_extra_bytes")
    rows = [
        ("setup", "GLM-5.2-FP8, TP8 + EP, Hopper, bf16 KV, --max-num-batched-tokens 16384, 32 x 1024 in / 128 out, "
                  "concurrency 32", f"GLM-5 geometry, TP8, h200 card, bf16 KV, 16384, 32 x 1024 at concurrency 32, "
                                    f"{wd} weights, experts '{mp}'",
         "-" if meas is None or not len(meas) else "the same point on one H200 (a rank's share of heads)",
         "GPU model not named in the PR; prefill_padding 64 says not Blackwell"),
        ("heads per rank -> workspace heads", "8 -> 64", f"{int(mod['num_heads'].iloc[0])} -> "
         f"{int(mod[mod['strategy'] == 'fused']['q_concat_heads'].iloc[0])}", "-", "vLLM's padding rule"),
        ("TTFT change, fused vs unfused", f"{rep['ttft_change_pct']:+.1f}%", f(t_f, "{:+.1f}%"),
         f(val(meas, "fused", "ttft_change_pct"), "{:+.1f}%"),
         f"modelled: TTFT scope '{scope}'" + (" (attention path only: a lower bound on TTFT, so it overstates the "
                                              "relative change)" if scope == "attention_path" else "")
         + "; measured: the attention path timed on the GPU per step, the rest of the layer from the same model"),
        ("TTFT change, kernel_native bound", "-", f(t_k, "{:+.1f}%"), "-", "modelled: a kernel taking the real heads"),
        ("extra memory per GPU", f"+{rep['extra_peak_mib']} MiB peak ({rep['peak_mib_before']} -> "
                                 f"{rep['peak_mib_after']} MiB)",
         "-" if x_b is None else f"+{x_b / 2**20:.0f} MiB persistent ({int(x_b):,} B)",
         "-" if pk_u is None or pk_f is None else
         f"layer call peak {pk_u / 2**20:.0f} MiB (unfused) vs {pk_f / 2**20:.0f} MiB (fused), on top of the workspace",
         "ours is the Q workspace alone (allocation size, exact); the PR's peak also moves with allocator rounding "
         "and other buffers. Per call, fused allocates no pad tensor, so its transient peak is lower"),
        ("total token throughput", f"{rep['throughput_change_pct']:+.0f}%", "not modelled", "-", ""),
    ]
    return pd.DataFrame(rows, columns=["quantity", "PR #53878 (reported)", "ours (modelled)", "ours (measured)",
                                       "note"])


def summary_table(df, tp=None, max_num_batched_tokens=None, compact: bool = False):
    """Table: per (model, tp, arch, max_num_batched_tokens, prompt_len, strategy) the heads, extra MiB,
    KV tokens lost, TTFT ms and change %, source. ``compact`` drops the columns that hold a single value (see
    :func:`constant_columns` for what they were)."""
    d = _ok(df)
    if tp is not None:
        d = d[d["tp"] == tp]
    if max_num_batched_tokens is not None:
        d = d[d["max_num_batched_tokens"] == max_num_batched_tokens]
    cols = ["model", "tp", "arch", "kv_cache_dtype", "max_num_batched_tokens", "prompt_len", "strategy", "num_heads",
            "q_concat_heads", "extra_persistent_mib", "kv_tokens_lost", "ttft_ms", "ttft_change_pct", "ttft_scope",
            "source"]
    cols = [c for c in cols if c in d.columns]
    out = d[cols].sort_values(cols[:7]).reset_index(drop=True)
    out = out.round({"extra_persistent_mib": 1, "kv_tokens_lost": 0, "ttft_ms": 2, "ttft_change_pct": 2})
    if compact and len(out) > 1:
        out = out[[c for c in out.columns if out[c].nunique(dropna=False) > 1 or c in ("model", "strategy")]]
    return out


def summary_html(df, tp=None, max_num_batched_tokens=None) -> str:
    """:func:`summary_table` as a compact HTML table whose caption names the values shared by every row."""
    full = summary_table(df, tp, max_num_batched_tokens)
    table = summary_table(df, tp, max_num_batched_tokens, compact=True)
    shared = ", ".join(f"{c} = {full[c].iloc[0]}" for c in full.columns if c not in table.columns and len(full))
    return html_table(table, caption=f"Every row: {shared}." if shared else None)


def html_table(df, caption: str | None = None) -> str:
    """A left-aligned HTML table without the index (for the report)."""
    sty = df.style.hide(axis="index").set_properties(**{"text-align": "left"}).set_table_styles(
        [{"selector": "th", "props": [("text-align", "left")]}])
    if caption:
        sty = sty.set_caption(caption)
    return sty.format(precision=2).to_html()


# ---------------------------------------------------------------------------------------- model validation, TP=2

_OP_CLASS_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31"]


def _measured_root() -> Path:
    import os

    return Path(os.environ.get("MLA_LAB_MEASURED") or REPO / "data" / "measured")


def load_validation(root: str | Path | None = None):
    """The TTFT model's predicted-vs-measured rows (every ``layer_validation.csv`` under ``root``, default env
    ``MLA_LAB_MEASURED`` or ``data/measured``; a ``run`` column names the folder). Empty DataFrame if none."""
    import pandas as pd

    root = Path(root) if root else _measured_root()
    frames = []
    for p in sorted(root.rglob("layer_validation.csv")) if root.is_dir() else []:
        v = pd.read_csv(p)
        v["run"] = str(p.parent.relative_to(root)) if p.parent != root else "."
        frames.append(v)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def validation_table(v):
    """MAPE (%) per level and op class, in sample and leave-one-model-out, with the number of rows."""
    if v is None or not len(v):
        return v
    g = v.groupby(["run", "level", "op_class", "split"])["ape_pct"].agg(["count", "mean", "max"]).reset_index()
    g = g.rename(columns={"count": "n", "mean": "MAPE_pct", "max": "max_APE_pct"})
    return g.round({"MAPE_pct": 1, "max_APE_pct": 1})


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


def tp2_table(path: str | Path | None = None):
    """Real TP=2 (two H200s, NCCL) vs the one-GPU simulation of a rank plus the modelled all-reduce, from
    ``data/measured/h200x2/tp2_attention.csv``: slowest rank per (model, T, strategy). Empty if not measured."""
    import pandas as pd

    path = Path(path) if path else _measured_root() / "h200x2" / "tp2_attention.csv"
    if not path.is_file():
        return pd.DataFrame()
    d = pd.read_csv(path)
    tp = d[d["run"] == "tp"].sort_values("block_ms").groupby(["model", "T", "strategy"]).tail(1)
    cols = ["model", "T", "strategy", "num_heads", "block_ms", "compute_ms", "sim_compute_ms", "allreduce_ms",
            "allreduce_model_ms", "time_error_pct", "compute_error_pct", "peak_extra_bytes", "sim_peak_extra_bytes",
            "mem_error_pct", "device", "git_commit"]
    out = tp[[c for c in cols if c in tp.columns]].sort_values(["model", "T", "strategy"]).reset_index(drop=True)
    return out.round(3)
