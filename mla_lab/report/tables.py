"""The report's tables (pandas DataFrames and their HTML): provenance, the seed setup (the PR's numbers beside the
lab's), the summary, the model validation. The TP runs: :mod:`.tp_ranks`."""

from __future__ import annotations

import html as _html
import json
from pathlib import Path

import pandas as pd

from ..labels import KERNEL_NATIVE_LABEL, KERNEL_NATIVE_NOTE
from ..placement import BASELINE, PR_STRATEGY
from ..seed import SEED, SEED_REPORTED, seed_point
from ..sweep.rows import modelled_rows
from .data import DEPLOYMENT_KEYS, ok_rows

__all__ = ["provenance_summary", "provenance_html", "save_provenance", "seed_setup_table", "summary_table",
           "measured_basis", "summary_html", "html_table", "validation_table"]

_PROV_KEYS = ("device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "code_version", "file")
_MODELLED_KEYS = ("ttft_scope", "calibration", "model_arch")
PR = PR_STRATEGY


def _uniq(g, col) -> list[str]:
    if col not in g.columns:
        return []
    return sorted({str(v) for v in g[col].dropna().unique() if str(v) not in ("", "nan")})


def _source_summary(src, g) -> dict:
    ts = _uniq(g, "timestamp")
    return {"rows": int(len(g)), **{k: _uniq(g, k) for k in _PROV_KEYS if _uniq(g, k)},
            **({"time_range": [ts[0], ts[-1]]} if ts else {}),
            **{k: _uniq(g, k) for k in (_MODELLED_KEYS if src == "modelled" else ()) if _uniq(g, k)},
            "archs": _uniq(g, "arch"), "models": _uniq(g, "model")}


def provenance_summary(df) -> dict:
    """Per source (``measured``/``modelled``): row count, devices and software, commits, time range, and for modelled
    rows the TTFT scope, calibration and arch cards; the measured notes. JSON-serialisable (the report index)."""
    out = {"rows": int(len(df)) if df is not None else 0, "sources": {}}
    if df is None or len(df) == 0 or "source" not in df.columns:
        return out
    out["sources"] = {str(src): _source_summary(src, g) for src, g in df.groupby("source")}
    out.update({f"measured_{k}": list(df.attrs[k]) for k in ("detached", "unstamped") if df.attrs.get(k)})
    return out


def _codes(s: dict, keys, named: bool = False) -> str:
    e = _html.escape
    return "; ".join((f"{k} " if named else "") + f"<code>{e(', '.join(s[k]))}</code>" for k in keys if k in s)


def _measured_line(m: dict | None) -> str:
    if m is None:
        return ("<li><b>Measured: none.</b> No measured rows under <code>data/measured/</code> match this grid; "
                "every TTFT below is modelled. Running the sweep on a GPU (device=auto) adds measured rows.</li>")
    return (f"<li><b>Measured: {m['rows']} rows</b> (filled markers) on "
            f"{_codes(m, ('device', 'sm', 'driver', 'cuda', 'torch', 'triton', 'flash_mla'), named=True)}; "
            f"commit {_codes(m, ('git_commit',))}; time {_html.escape(' .. '.join(m.get('time_range', [])))}; "
            f"files {_codes(m, ('file',))}.</li>")


def _modelled_line(m: dict) -> str:
    where = _codes(m, ("device", "torch"), named=True)
    bits = [f"<b>Modelled: {m['rows']} rows</b> (hollow markers). Memory: exact bytes "
            "(<code>mla_lab.buffers.memory_account</code>). TTFT: <code>mla_lab.model.ttft.predict_ttft</code>",
            f", scope {_codes(m, ('ttft_scope',))}" if "ttft_scope" in m else "",
            f"; calibration {_codes(m, ('calibration',))}" if "calibration" in m else "",
            f"; arch cards {_codes(m, ('archs',))} (datasheet rates; non-H200 cards reuse the H200 efficiencies).",
            f" Computed on {where}" if where else "",
            f" at commit {_codes(m, ('git_commit',))}" if "git_commit" in m else "",
            f", code version {_codes(m, ('code_version',))}" if "code_version" in m else "",
            f", {_html.escape(' .. '.join(m['time_range']))}" if m.get("time_range") else ""]
    return "<li>" + "".join(bits) + ".</li>"


#: (attrs key, how the banner opens its lines, style): detached rows (another model config,
#: :func:`mla_lab.report.data.detach_stale`), unstamped files, rows withheld (issue 39).
_NOTES = (("detached", "Detached:", " style='color:#a00'"), ("unstamped", "Unstamped:", ""),
          ("withheld", "Measured, not shown:", ""))


def provenance_html(df, run_id: str | None = None) -> str:
    """The report's provenance banner (HTML): which rows are measured, on what GPU and software at which commit;
    which are modelled, by which TTFT model and calibration; one line per note of ``df.attrs`` (:data:`_NOTES`)."""
    e = _html.escape
    src = provenance_summary(df)["sources"]
    rows = [_measured_line(src.get("measured"))] + ([_modelled_line(src["modelled"])] if "modelled" in src else [])
    rows += [f"<li><b>{e(o)}: {src[o]['rows']} rows</b>.</li>" for o in sorted(set(src) - {"measured", "modelled"})]
    attrs = getattr(df, "attrs", None) or {}
    rows += [f"<li{style}><b>{head}</b> {e(n)}.</li>" for k, head, style in _NOTES for n in attrs.get(k, [])]
    rid = f" &middot; run <code>{e(run_id)}</code>" if run_id else ""
    return ("<div style='border:2px solid #1f77b4;border-radius:6px;padding:8px 14px;background:#f3f8fd;"
            f"margin:8px 0'><b>Provenance</b>{rid}<ul style='margin:4px 0'>{''.join(rows)}</ul></div>")


def save_provenance(df, figure_dir: str | Path, **extra) -> Path:
    """Write :func:`provenance_summary` (plus ``extra``) to ``<figure_dir>/provenance.json`` for the report index."""
    p = Path(figure_dir) / "provenance.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({**provenance_summary(df), **extra}, indent=1, default=str))
    return p


def measured_basis(rows) -> str:
    """What a measured sweep row's TTFT rests on: one process, ``num_runs`` interleaved rounds
    (:func:`mla_lab.sweep.rows.measured_rows`), unlike the seed answer's fresh processes."""
    n = rows["num_runs"].dropna().unique() if "num_runs" in getattr(rows, "columns", ()) else []
    return "one process" + (f", {int(n[0])} interleaved runs" if len(n) == 1 else "")


def _at_seed(d, measured: bool):
    """Rows of ``d`` (ok) at the seed's point, measured or not (``source``); None stays None."""
    if d is None or len(d) == 0:
        return d.iloc[0:0] if d is not None else None
    d = ok_rows(d)
    for k in (*DEPLOYMENT_KEYS, "num_prompts"):
        if k in d.columns:
            d = d[d[k].astype(str) == str(SEED[k])]
    return d[(d["source"] == "measured") == measured] if "source" in d.columns else d


def _median(d, s, col) -> float | None:
    """The median of ``col`` over the rows of strategy ``s`` (None: no such value)."""
    if d is None or len(d) == 0 or col not in d.columns:
        return None
    v = d[d["strategy"] == s][col].dropna()
    return float(v.median()) if len(v) else None


def _measured_change(meas, answer_rows) -> str:
    """The PR's measured TTFT change at the seed: the seed answer's (fresh processes) when given, else the measured
    sweep rows' median with their basis."""
    a = next((r for r in (answer_rows or []) if r["model"] == SEED["model"] and r["strategy"] == PR
              and r["against"] == BASELINE and r["measured_pct"] is not None), None)
    if a is not None:
        return (f"{a['measured_pct']:+.1f}% [{a['measured_lo']:+.1f}, {a['measured_hi']:+.1f}] "
                f"({a['n_processes']} fresh processes)")
    v = _median(meas, PR, "ttft_change_pct")
    return "-" if v is None else f"{v:+.1f}% ({measured_basis(meas[meas['strategy'] == PR])})"


def seed_setup_table(df=None, measured=None, serving=None, answer_rows=None):
    """The PR's reported numbers at its benchmark beside the lab's (DataFrame): modelled from ``df`` at the seed
    point, else priced now; measured from ``answer_rows`` (:func:`mla_lab.report.seed_answer.seed_answer`), else the
    measured rows; ``serving`` (a serve_benchmark result of the seed) for the throughput row."""
    mod = _at_seed(df, measured=False)
    if mod is None or len(mod) == 0 or not {PR, BASELINE} <= set(mod["strategy"]):
        mod = pd.DataFrame(modelled_rows(seed_point(strategies=[BASELINE, PR, "kernel_native"])))
    meas = _at_seed(measured, measured=True)

    scope = ", ".join(map(str, mod["ttft_scope"].dropna().unique())) if "ttft_scope" in mod.columns else "?"
    t_f, t_k = ("-" if v is None else f"{v:+.1f}%"
                for v in (_median(mod, s, "ttft_change_pct") for s in (PR, "kernel_native")))
    x_b = _median(mod, PR, "extra_persistent_bytes")
    tr_u, tr_f = _median(mod, BASELINE, "call_transient_bytes"), _median(mod, PR, "call_transient_bytes")
    rep = SEED_REPORTED
    wd = str(mod["weight_dtype"].iloc[0]) if "weight_dtype" in mod.columns else "fp8"
    mp = str(mod["moe_parallel"].iloc[0]) if "moe_parallel" in mod.columns else "ep"
    pk_u, pk_f = _median(meas, BASELINE, "measured_peak_extra_bytes"), _median(meas, PR, "measured_peak_extra_bytes")
    measured_change = _measured_change(meas, answer_rows)
    rows = [
        ("setup", "GLM-5.2-FP8, TP8 + EP, Hopper, bf16 KV, --max-num-batched-tokens 16384, 32 x 1024 in / 128 out, "
                  "concurrency 32", f"GLM-5 geometry, TP8, h200 card, bf16 KV, 16384, 32 x 1024 at concurrency 32, "
                                    f"{wd} weights, experts '{mp}'",
         "-" if meas is None or not len(meas) else "the same point on one H200 (a rank's share of heads)",
         "GPU model not named in the PR; prefill_padding 64 says not Blackwell"),
        ("heads per rank -> workspace heads", "8 -> 64", f"{int(mod['num_heads'].iloc[0])} -> "
         f"{int(mod[mod['strategy'] == PR]['q_concat_heads'].iloc[0])}", "-", "vLLM's padding rule"),
        ("TTFT change, vLLM #53878 vs vLLM before it (zero padded heads)", f"{rep['ttft_change_pct']:+.1f}%",
         t_f, measured_change,
         f"modelled: TTFT scope '{scope}'" + (" (attention path only: a lower bound on TTFT, so it overstates the "
                                              "relative change)" if scope == "attention_path" else "")
         + "; measured: the attention path timed on the GPU per step, the rest of the layer from the same model"),
        (f"TTFT change, kernel_native ({KERNEL_NATIVE_LABEL})", "-", t_k, "-", KERNEL_NATIVE_NOTE),
        ("extra memory per GPU", f"+{rep['extra_peak_mib']} MiB peak ({rep['peak_mib_before']} -> "
                                 f"{rep['peak_mib_after']} MiB)",
         "-" if x_b is None else f"+{x_b / 2**20:.0f} MiB persistent ({int(x_b):,} B)",
         "-" if pk_u is None or pk_f is None else
         f"layer call peak {pk_u / 2**20:.0f} MiB (before) vs {pk_f / 2**20:.0f} MiB (PR), on top of the workspace",
         "ours is the Q workspace's extra alone (its allocation minus vLLM's unpadded buffer before the PR, exact); "
         "the PR's peak also moves with allocator rounding "
         "and other buffers. Per call, the PR allocates no pad tensor: its unbudgeted transient peak is "
         + ("-" if tr_u is None else f"{tr_f / 2**20:.0f} vs {tr_u / 2**20:.0f} MiB")),
        ("total token throughput", f"{rep['throughput_change_pct']:+.0f}%",
         "not modelled" if not serving or PR not in serving["strategies"] else
         f"{serving['strategies'][PR]['change_pct']['total_token_throughput']:+.1f}%", "-",
         "" if not serving else "modelled: a step-level simulation of vllm bench serve (32 x 1024 in / 128 out, "
         "concurrency 32), decode steps through the same padded kernel (mla_lab.serving)"),
    ]
    return pd.DataFrame(rows, columns=["quantity", "PR #53878 (reported)", "ours (modelled)", "ours (measured)",
                                       "note"])


def summary_table(df, tp=None, max_num_batched_tokens=None, compact: bool = False, label_basis: bool = False):
    """Per (model, tp, arch, max_num_batched_tokens, prompt_len, strategy): the source, TTFT ms and change %, extra
    MiB, KV tokens lost, heads. ``compact`` drops the columns holding one value; ``label_basis``: a measured row's
    source says what it rests on (:func:`measured_basis`)."""
    d = ok_rows(df)
    for k, v in (("tp", tp), ("max_num_batched_tokens", max_num_batched_tokens)):
        d = d if v is None else d[d[k] == v]
    if label_basis and "source" in d.columns:
        d = d.copy()
        m = d["source"] == "measured"
        d.loc[m, "source"] = [f"measured ({measured_basis(d.loc[[i]])})" for i in d.index[m]]
    # the row's name, then its source and figures first: a narrow view (html_table) still says which row is which
    cols = ["model", "tp", "arch", "kv_cache_dtype", "max_num_batched_tokens", "prompt_len", "strategy", "source",
            "ttft_ms", "ttft_change_pct", "extra_persistent_mib", "kv_tokens_lost", "num_heads", "q_concat_heads",
            "ttft_scope"]
    cols = [c for c in cols if c in d.columns]
    out = d[cols].sort_values(cols[:8]).reset_index(drop=True)
    out = out.round({"extra_persistent_mib": 1, "kv_tokens_lost": 0, "ttft_ms": 2, "ttft_change_pct": 2})
    if compact and len(out) > 1:
        out = out[[c for c in out.columns if out[c].nunique(dropna=False) > 1 or c in ("model", "strategy")]]
    return out

def summary_html(df, tp=None, max_num_batched_tokens=None) -> str:
    """:func:`summary_table` as a compact HTML table whose caption names the values shared by every row."""
    full = summary_table(df, tp, max_num_batched_tokens, label_basis=True)
    table = summary_table(df, tp, max_num_batched_tokens, compact=True, label_basis=True)
    shared = ", ".join(f"{c} = {full[c].iloc[0]}" for c in full.columns if c not in table.columns and len(full))
    return html_table(table, caption=f"Every row: {shared}." if shared else None)

#: The most columns a table shows on the page (a 1280 px window; issue 22); a wider one folds the rest.
MAX_COLUMNS = 9


def html_table(df, caption: str | None = None, max_cols: int | None = MAX_COLUMNS) -> str:
    """A left-aligned HTML table without the index. Over ``max_cols`` columns (None: no limit): the first
    ``max_cols`` with a note, and the full table folded in a ``<details>`` block scrolling inside its own box."""
    def render(d, cap):
        sty = d.style.hide(axis="index").set_properties(**{"text-align": "left"}).set_table_styles(
            [{"selector": "th", "props": [("text-align", "left")]}])
        if cap:
            sty = sty.set_caption(cap)
        return sty.format(precision=2).to_html()

    if max_cols is None or df.shape[1] <= max_cols:
        return render(df, caption)
    more = df.shape[1] - max_cols
    narrow = render(df.iloc[:, :max_cols], caption)
    full = render(df, None)
    return (f"{narrow}<details><summary>all {df.shape[1]} columns ({more} more: "
            f"{_html.escape(', '.join(map(str, df.columns[max_cols:])))})</summary>"
            f"<div style='overflow-x:auto; max-width:100%'>{full}</div></details>")

#: Levels of the validation CSVs left out of the table: the difference of two *unpaired* layer timings is run-to-run
#: noise (~+-1 ms against a ~0.5 ms difference); strategy differences are validated from interleaved pairs instead.
UNPAIRED_DELTA_LEVELS = ("layer_delta", "layer_graph_delta")


def validation_table(v, include_unpaired_deltas: bool = False):
    """MAPE (%) per level and op class, in sample and leave-one-model-out, with the number of rows. The unpaired
    layer deltas (:data:`UNPAIRED_DELTA_LEVELS`) are left out unless ``include_unpaired_deltas``."""
    if v is None or not len(v):
        return v
    if not include_unpaired_deltas:
        v = v[~v["level"].isin(UNPAIRED_DELTA_LEVELS)]
    g = v.groupby(["run", "level", "op_class", "split"])["ape_pct"].agg(["count", "mean", "max"]).reset_index()
    g = g.rename(columns={"count": "n", "mean": "MAPE_pct", "max": "max_APE_pct"})
    return g.round({"MAPE_pct": 1, "max_APE_pct": 1})
