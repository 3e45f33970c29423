"""Charts and tables of sweep rows (matplotlib + pandas). Every figure says which points are measured and which
modelled."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_memory_vs_ttft", "summary_table", "provenance_banner", "load_measured", "failed_points"]

REPO = Path(__file__).resolve().parent.parent
_STRAT_COLORS = {"unfused": "#7f7f7f", "fused": "#1f77b4", "kernel_native": "#2ca02c"}
_MODEL_MARKERS = ["o", "s", "^", "D", "v", "P"]


def load_measured(root: str | Path | None = None, pattern: str = "padding_sweep*.csv"):
    """Rows of ``data/measured/**/<pattern>`` whose ``source`` column is ``measured`` (empty DataFrame if none).
    The default pattern picks the measured sweep files (same columns as the modelled sweep)."""
    import pandas as pd

    root = Path(root) if root else REPO / "data" / "measured"
    frames = []
    for p in sorted(root.rglob(pattern)) if root.is_dir() else []:
        df = pd.read_csv(p)
        if "source" in df.columns:
            df = df[df["source"] == "measured"].copy()
            df["file"] = str(p.relative_to(root))
            frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def failed_points(df):
    """Rows of points that failed (status != ok), with their reason."""
    if "status" not in df.columns:
        return df.iloc[0:0]
    cols = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "source",
                        "status", "reason") if c in df.columns]
    return df[df["status"] != "ok"][cols]


def provenance_banner(df) -> str:
    """One Markdown paragraph: how many rows are measured (on which GPU/software/commit) and how many modelled."""
    if df is None or len(df) == 0 or "source" not in df.columns:
        return "**No rows.**"
    parts = []
    for src, g in df.groupby("source"):
        keys = [c for c in ("device", "driver", "torch", "triton", "flash_mla", "git_commit") if c in g.columns]
        combos = g[keys].drop_duplicates().astype(str).to_dict("records")
        desc = "; ".join(", ".join(f"{k}={v}" for k, v in c.items()) for c in combos[:3])
        extra = ""
        if src == "modelled" and "calibration" in g.columns:
            extra = f" TTFT scope: {', '.join(map(str, g.get('ttft_scope', []).dropna().unique()))}; " \
                    f"calibration: {', '.join(map(str, g['calibration'].dropna().unique()))}."
        parts.append(f"**{src}**: {len(g)} rows ({desc}).{extra}")
    return " ".join(parts)


def plot_memory_vs_ttft(df, x: str = "extra_persistent_mib", y: str = "ttft_change_pct", kv_cache_dtype="bf16",
                        title: str | None = None):
    """Scatter of extra workspace memory per rank (x, MiB vs unfused) against TTFT change vs unfused (y, %), one
    panel per arch, colour by strategy, marker by model; modelled points hollow, measured filled.

    Returns the matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    d = df[(df.get("status", "ok") == "ok")] if "status" in df.columns else df
    if "kv_cache_dtype" in d.columns and kv_cache_dtype:
        d = d[d["kv_cache_dtype"] == kv_cache_dtype]
    archs = sorted(d["arch"].dropna().unique()) or ["-"]
    models = sorted(d["model"].dropna().unique())
    fig, axes = plt.subplots(1, len(archs), figsize=(6.2 * len(archs), 4.6), squeeze=False, sharey=True)
    for ax, a in zip(axes[0], archs):
        sub = d[d["arch"] == a]
        for (s, m), g in sub.groupby(["strategy", "model"]):
            mk = _MODEL_MARKERS[models.index(m) % len(_MODEL_MARKERS)]
            for src, gg in g.groupby(g.get("source", "modelled")):
                filled = src == "measured"
                ax.scatter(gg[x], gg[y], marker=mk, s=46 if filled else 38,
                           facecolors=_STRAT_COLORS.get(s, "k") if filled else "none",
                           edgecolors=_STRAT_COLORS.get(s, "k"), linewidths=1.3,
                           label=f"{s} · {m} · {src}")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(f"{a} (prefill_padding {sub['prefill_padding'].iloc[0] if len(sub) else '?'})")
        ax.set_xlabel("extra Q workspace per rank vs unfused [MiB]")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("TTFT change vs unfused [%]")
    handles, labels = [], []
    for ax in axes[0]:
        h, lab = ax.get_legend_handles_labels()
        for hh, ll in zip(h, lab):
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(title or "Memory vs TTFT per strategy (hollow = modelled, filled = measured)")
    fig.tight_layout(rect=(0, 0.06 + 0.03 * ((len(labels) - 1) // 4), 1, 0.95))
    return fig


def summary_table(df, tp=None, max_num_batched_tokens=None):
    """Compact table: per (model, tp, arch, max_num_batched_tokens, prompt_len, strategy) the heads, extra MiB,
    KV tokens lost, TTFT ms and change %, source."""
    d = df[df["status"] == "ok"] if "status" in df.columns else df
    if tp is not None:
        d = d[d["tp"] == tp]
    if max_num_batched_tokens is not None:
        d = d[d["max_num_batched_tokens"] == max_num_batched_tokens]
    cols = ["model", "tp", "arch", "kv_cache_dtype", "max_num_batched_tokens", "prompt_len", "strategy", "num_heads",
            "q_concat_heads", "extra_persistent_mib", "kv_tokens_lost", "ttft_ms", "ttft_change_pct", "ttft_scope",
            "source"]
    cols = [c for c in cols if c in d.columns]
    out = d[cols].sort_values(cols[:7]).reset_index(drop=True)
    return out.round({"extra_persistent_mib": 1, "kv_tokens_lost": 0, "ttft_ms": 2, "ttft_change_pct": 2})
