"""The logic behind ``notebooks/explore.ipynb``: :func:`explore_point` prices one
:class:`~mla_lab.deployment.Deployment` through :func:`mla_lab.sweep.rows.price` and picks the matching measured
rows; :class:`Explorer` wraps it in ipywidgets whose changes re-render in place (tests drive it headless).
"""

from __future__ import annotations

import contextlib
import functools
import html
import io
import textwrap

from .arch import ARCHS, get_arch
from .buffers import MIB
from .cli_doors import MAX_PRICED_STEPS
from .deployment import MOE_PARALLEL, WEIGHT_DTYPES, Deployment
from .labels import KERNEL_NATIVE_NOTE, PACKED_NOTE
from .models import KV_CACHE_DTYPES, load_model, model_names
from .placement import BASELINE, EXPLORER_STRATEGIES, PR_STRATEGY, resolve_strategy
from .report.data import load_measured, withhold_off_route
from .report.figures import strategy_style
from .seed import SEED_DEPLOYMENT
from .sweep.advise import advise, engines_block, format_advice
from .sweep.rows import MEASURED_MATCH_KEYS, measured_changes, measured_matching, price

#: The controls that make the deployment (:meth:`mla_lab.deployment.Deployment.of` arguments).
DEPLOYMENT_CONTROLS = ("model", "tp", "arch", "max_num_batched_tokens", "kv_cache_dtype", "prompt_len",
                       "num_prompts", "concurrency", "weight_dtype", "moe_parallel", "gpu_memory_utilization")

__all__ = ["EXPLORER_STRATEGIES", "explore_point", "Explorer", "tp_options", "render_chart",
           "CONTROL_OPTIONS", "DEPLOYMENT_CONTROLS"]

CONTROL_OPTIONS = {"max_num_batched_tokens": [2048, 4096, 8192, 16384, 32768, 65536], "num_prompts": (1, 256),
                   "prompt_len": [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]}


def tp_options(model: str) -> list[int]:
    """TP sizes offered for ``model``: powers of two up to 64 that divide its ``num_attention_heads``."""
    heads = load_model(model).num_attention_heads
    return [tp for tp in (1, 2, 4, 8, 16, 32, 64) if heads % tp == 0]


@functools.lru_cache(maxsize=512)
def _rows(deployment: Deployment) -> dict:
    """The sweep's own rows for one deployment by strategy (:func:`mla_lab.sweep.rows.price`; cached: the controls
    revisit selections)."""
    return {r.name: r for r in price(deployment, EXPLORER_STRATEGIES)}


def explore_point(deployment: Deployment = SEED_DEPLOYMENT, strategy: str = PR_STRATEGY, measured=None) -> dict:
    """Price one deployment through :func:`mla_lab.sweep.rows.price` (the sweep's numbers) and attach the matching
    measured rows; ``strategy`` (a door name) is the one the headline numbers describe. Returns ``{"selection",
    "num_heads", "prefill_padding", "padded_heads", "workspace_bytes", "workspace_mib", "extra_bytes", "extra_mib",
    "kv_tokens_lost", "kv_capacity_pct_lost", "kv_capacity_tokens", "per_strategy" (one dict per
    :data:`EXPLORER_STRATEGIES`), "ttft_scope", "num_steps", "fits_in_memory", "fit_reason", "measured", "engines"}``
    (numbers None where it does not fit). ValueError: not a Deployment; more than :data:`MAX_PRICED_STEPS` steps;
    ``measured`` not a DataFrame; an unknown strategy; what the row builder rejects.
    """
    if not isinstance(deployment, Deployment):
        raise ValueError(f"deployment={deployment!r} must be a mla_lab.deployment.Deployment (Deployment.of(...) "
                         "or Deployment.seed())")
    steps = deployment.num_prompts * -(-deployment.prompt_len // deployment.max_num_batched_tokens)
    if steps > MAX_PRICED_STEPS:  # the explorer's door: a 2**40-token prompt priced for minutes (issue 39)
        raise ValueError(f"num_prompts={deployment.num_prompts} x prompt_len={deployment.prompt_len} at "
                         f"max_num_batched_tokens={deployment.max_num_batched_tokens} is {steps:,} prefill steps to "
                         f"price per strategy; allowed: at most {MAX_PRICED_STEPS:,} (fewer or shorter prompts)")
    if measured is not None and not hasattr(measured, "columns"):
        raise ValueError(f"measured= a {type(measured).__name__} is not a DataFrame of measured sweep rows; allowed: "
                         "mla_lab.report.data.load_measured() or None")
    strategy = resolve_strategy(strategy)
    rows, args = _rows(deployment), deployment.args()
    sel = {k: args[k] for k in MEASURED_MATCH_KEYS} | {"strategy": strategy}
    meas = None  # measured only where the measured kernel runs and the deployment fits (issue 39)
    if measured is not None and len(measured):
        meas, _ = withhold_off_route(measured_matching(measured, deployment))
        meas = meas.reset_index(drop=True) if len(meas) else None
    changes = measured_changes(meas, deployment) if meas is not None else {}  # the one measured-change function
    c = rows[strategy]
    return {"selection": sel, "num_heads": deployment.num_heads, "prefill_padding": deployment.arch.prefill_padding,
            "padded_heads": c.memory.q_concat_heads,
            **_numbers(c, {"workspace_bytes": c.memory.persistent_bytes, "extra_bytes": c.extra_persistent_bytes,
                           "workspace_mib": c.memory.persistent_bytes / MIB, "extra_mib": c.extra_persistent_mib,
                           "kv_tokens_lost": c.kv_tokens_lost, "kv_capacity_pct_lost": c.kv_capacity_pct_lost,
                           "kv_capacity_tokens": c.kv_capacity_tokens}),
            "per_strategy": [_per_strategy(rows[s], changes) for s in EXPLORER_STRATEGIES],
            "ttft_scope": c.ttft_scope, "num_steps": c.num_steps, "fits_in_memory": c.fits_in_memory,
            "fit_reason": c.fit_reason, "measured": meas if c.fits_in_memory else None,
            # what today's engine versions do for this deployment (a code reading of their release wheels)
            "engines": engines_block(deployment)}


def _per_strategy(r, changes: dict) -> dict:
    """One strategy's line of :func:`explore_point` (its numbers None where its own workspace does not fit)."""
    m = changes.get(r.name) if r.fits_in_memory else None
    return {"strategy": r.name, "q_concat_heads": r.memory.q_concat_heads, "kernel_heads": r.memory.kernel_heads,
            "fits_in_memory": r.fits_in_memory, "fit_reason": r.fit_reason,
            "measured_ttft_ms": None if m is None else m["ttft_ms"],
            "measured_change_pct": None if m is None else m["change_pct"],
            **_numbers(r, {"persistent_bytes": r.memory.persistent_bytes,
                           "workspace_mib": r.memory.persistent_bytes / MIB, "extra_mib": r.extra_persistent_mib,
                           "peak_bytes": r.memory.peak_bytes, "ttft_ms": r.ttft_ms, "ttft_ms_max": r.ttft_ms_max,
                           "ttft_change_pct": r.ttft_change_pct, "kv_tokens_lost": r.kv_tokens_lost,
                           "kv_capacity_pct_lost": r.kv_capacity_pct_lost})}


def _numbers(row, values: dict) -> dict:
    """``values`` when the row fits, else the same keys set to None: a deployment that cannot run (its weights or
    its workload do not fit, ``row.fit_reason``) has no TTFT or memory number."""
    return dict(values) if row.fits_in_memory else dict.fromkeys(values)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def render_chart(result: dict, dpi: int = 90) -> bytes:
    """PNG bytes of two panels per strategy: persistent Q workspace (MiB) and TTFT change (%), the selected strategy
    outlined, measured changes (``per_strategy[i]["measured_change_pct"]``, as the tables print them) as black
    diamonds. A deployment that does not fit gets no bars, only the reason."""
    from matplotlib.figure import Figure

    rows = result["per_strategy"]
    names = [r["strategy"] for r in rows]
    if not result.get("fits_in_memory", True):
        fig = Figure(figsize=(7.6, 1.6), dpi=dpi, layout="constrained")
        ax = fig.add_subplot()
        ax.axis("off")
        reason = str(result.get("fit_reason") or "")
        ax.text(0.5, 0.5, "this deployment does not fit, so it has no TTFT or memory result:\n"
                + textwrap.fill(reason, width=70, max_lines=4, placeholder=" ..."),  # at spaces: "0.9" stays whole
                ha="center", va="center", fontsize=9)
        return _png(fig)
    fig = Figure(figsize=(7.6, 3.6), dpi=dpi, layout="constrained")
    ax_m, ax_t = fig.subplots(1, 2)
    x = list(range(len(rows)))
    bar = {"color": [strategy_style(n)[0] for n in names], "edgecolor": "black", "linewidth":
           [2.4 if n == result["selection"]["strategy"] else 0.0 for n in names],
           "hatch": ["///" if n.endswith(":views") else None for n in names]}
    nan = float("nan")  # a strategy whose own workspace does not fit has no bar (its numbers are None)
    for ax, key, fmt, margin in ((ax_m, "workspace_mib", "{:.0f}", 0.3), (ax_t, "ttft_change_pct", "{:+.1f}%", 0.35)):
        vals = [nan if r[key] is None else r[key] for r in rows]
        ax.bar_label(ax.bar(x, vals, **bar), labels=["does not fit" if v != v else fmt.format(v) for v in vals],
                     fontsize=7, padding=2, rotation=90)
        ax.margins(y=margin)
    ax_m.set_title("persistent Q workspace per rank\n(exact bytes)", fontsize=9.5)
    ax_m.set_ylabel("MiB")
    ax_t.axhline(0, color="k", lw=0.6)
    # the measured change as the table under the chart prints it (measured vs the measured baseline)
    mx = [(i, r["measured_change_pct"]) for i, r in enumerate(rows) if r.get("measured_change_pct") is not None]
    if mx:
        ax_t.plot([i + 0.32 for i, _ in mx], [v for _, v in mx], "D", color="black", ms=6)
    ax_t.set_title(f"TTFT change vs {BASELINE}\n(scope {result['ttft_scope']}; bars modelled"
                   + (", \u25c6 measured)" if mx else ")"), fontsize=8.5)
    ax_t.set_ylabel("%")
    for ax in (ax_m, ax_t):
        ax.set_xticks(x, names, fontsize=7.5, rotation=35, ha="right")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    return _png(fig)


def _fmt_int(n) -> str:
    return f"{int(round(n)):,}"


_TD = "style='padding:2px 12px 2px 0'"


def _tr(cells, tag: str = "td", style: str = "") -> str:
    return f"<tr{style}>" + "".join(f"<{tag} {_TD}>{v}</{tag}>" for v in cells) + "</tr>"


def summary_html(result: dict) -> str:
    """The headline numbers and the per-strategy table of :func:`explore_point` as HTML."""
    sel = result["selection"]
    e = html.escape
    head = (f"<b>{e(sel['model'])}</b>, TP {sel['tp']}, {e(sel['arch'])} (prefill_padding {result['prefill_padding']}),"
            f" {e(sel['kv_cache_dtype'])} KV cache, max_num_batched_tokens {_fmt_int(sel['max_num_batched_tokens'])},"
            f" {sel['num_prompts']} x {_fmt_int(sel['prompt_len'])}-token prompts")
    if not result.get("fits_in_memory", True):  # no TTFT or memory number for a deployment that cannot run
        return (f"<div>{head}<p>heads per rank → padded heads: <b>{result['num_heads']} → {result['padded_heads']}"
                f"</b></p><p><b>This deployment does not fit</b>: {e(str(result.get('fit_reason') or ''))}. "
                "It has no TTFT or memory result; change TP, the weight dtype or gpu_memory_utilization.</p></div>")
    pct = result.get("kv_capacity_pct_lost")
    pct_txt = "" if pct is None or pct != pct else f" ({pct:.1f} % of KV capacity)"
    facts = [("heads per rank → padded heads", f"{result['num_heads']} → {result['padded_heads']}"),
             (f"Q workspace ({e(sel['strategy'])})",
              f"{_fmt_int(result['workspace_bytes'])} B = {result['workspace_mib']:.1f} MiB"),
             (f"extra vs {BASELINE}", f"{_fmt_int(result['extra_bytes'])} B = {result['extra_mib']:.1f} MiB = "
                                       f"{_fmt_int(result['kv_tokens_lost'])} KV tokens{pct_txt}"),
             ("KV-cache tokens lost per rank", _fmt_int(result["kv_tokens_lost"]) + pct_txt),
             ("chunked-prefill steps", str(result["num_steps"]))]
    facts_html = "".join(f"<tr><td {_TD}>{k}</td><td style='text-align:right'><b>{v}</b></td></tr>" for k, v in facts)
    cells = []
    for r in result["per_strategy"]:
        meas = "-" if r["measured_ttft_ms"] is None else f"{r['measured_ttft_ms']:.2f}"
        mchg = "-" if r.get("measured_change_pct") is None else f"{r['measured_change_pct']:+.2f}%"
        if r.get("fits_in_memory") is False:  # this strategy's own workspace does not fit: no number
            cells.append(f"<tr><td {_TD}>{e(r['strategy'])}</td><td {_TD}>{r['q_concat_heads']}</td>"
                         f"<td {_TD} colspan='8'>does not fit: {e(str(r.get('fit_reason') or ''))}</td></tr>")
            continue
        style = " style='font-weight:bold;background:#eef4fb'" if r["strategy"] == sel["strategy"] else ""
        kv = r.get("kv_capacity_pct_lost")
        cells.append(_tr((e(r["strategy"]), r["q_concat_heads"], f"{r['workspace_mib']:.1f}", f"{r['extra_mib']:+.1f}",
                          _fmt_int(r["kv_tokens_lost"]), "-" if kv is None or kv != kv else f"{kv:.1f}",
                          f"{r['ttft_ms']:.2f}", f"{r['ttft_change_pct']:+.2f}%", meas, mchg), style=style))
    heads = ("strategy", "workspace heads", "workspace MiB", "extra MiB", "KV tokens lost", "% of KV",
             "TTFT ms (modelled)", f"vs {BASELINE}", "TTFT ms (measured)", f"measured vs {BASELINE}")
    table = f"<table style='border-collapse:collapse;margin-top:6px'>{_tr(heads, 'th')}{''.join(cells)}</table>"
    note = (f"<small>TTFT: modelled, scope <code>{e(str(result['ttft_scope']))}</code> (mla_lab.sweep.rows.price);"
            " memory: exact bytes (mla_lab.buffers.memory_account).</small>")
    shown = {r["strategy"] for r in result["per_strategy"]}
    note += "".join(f"<br><small>{n} = {e(t)}.</small>" for n, t in (("kernel_native", KERNEL_NATIVE_NOTE),
                                                                      ("packed", PACKED_NOTE)) if n in shown)
    eng = "".join(_tr((f"{e(x['preset'])} ({e(str(x['release_date']))})", e(str(x["backend"])),
                       e(str(x["prefill_route"])), x["padding"] if x["padding"] else "none", e(str(x["padded_path"]))))
                  for x in result.get("engines", []))
    eng_html = ("<p style='margin:8px 0 2px'><b>Engine versions today</b> (code reading of the release wheels; "
                "<code>mla-lab engines</code>)</p><table style='border-collapse:collapse'>"
                + _tr(("engine", "sparse backend", "prefill route", "prefill_padding", "padded path runs"), "th")
                + eng + "</table>") if eng else ""
    return f"<div>{head}<table style='margin-top:6px'>{facts_html}</table>{table}{note}{eng_html}</div>"


def measured_html(result: dict) -> str:
    """The measured rows matching the selection (with their provenance), or a line saying there are none."""
    meas = result["measured"]
    if not result.get("fits_in_memory", True):
        return ("<i>This deployment does not fit, so no measured row is shown for it (a row measured on a one-GPU "
                "share of it is not a result of the deployment).</i>")
    if meas is None or len(meas) == 0:
        return ("<i>No measured rows in data/measured for this selection (or none whose route runs the measured "
                "kernel: a dense-MHA route shows none): the numbers above are modelled.</i>")
    cols = [c for c in ("strategy", "ttft_ms", "ttft_change_pct", "extra_persistent_mib", "peak_bytes", "device",
                        "torch", "flash_mla", "git_commit", "timestamp", "file") if c in meas.columns]
    return f"<b>Measured rows for this selection ({len(meas)})</b>" + meas[cols].to_html(index=False, float_format=
                                                                                          lambda v: f"{v:.2f}")


class Explorer:
    """ipywidgets controls around :func:`explore_point`; every control change calls :meth:`update`.

    ``measured``: measured rows (default :func:`mla_lab.report.data.load_measured`); ``initial``: control values.
    Attributes: ``controls`` (name -> widget), ``summary`` / ``chart`` / ``measured_out`` / ``advice_out``,
    ``deployment`` and ``result`` (the last valid ones), ``error`` (the last message or ""), ``widget`` (the VBox).
    """

    def __init__(self, measured=None, **initial):
        import ipywidgets as W

        if measured is None:
            measured = load_measured()
        self.measured = measured
        models, get = model_names(), initial.get
        model = get("model", "glm-5" if "glm-5" in models else models[0])
        wide = {"style": {"description_width": "150px"}, "layout": W.Layout(width="480px")}
        narrow = {"style": wide["style"], "layout": W.Layout(width="260px")}
        toggle = {"style": {"button_width": "110px"}}
        n_max = CONTROL_OPTIONS["num_prompts"][1]
        self.controls = {
            "model": W.Dropdown(options=models, value=model, description="model", **wide),
            "tp": W.Dropdown(options=tp_options(model), value=get("tp", 8), description="TP size", **wide),
            "arch": W.Dropdown(options=sorted(ARCHS), value=get_arch(get("arch", "h200")).name,
                               description="GPU architecture", **wide),
            "max_num_batched_tokens": W.SelectionSlider(
                options=CONTROL_OPTIONS["max_num_batched_tokens"], value=get("max_num_batched_tokens", 16384),
                description="max batched tokens", continuous_update=False, **wide,
                tooltip="vLLM --max-num-batched-tokens: the chunk size and the workspace rows"),
            "kv_cache_dtype": W.ToggleButtons(options=list(KV_CACHE_DTYPES), value=get("kv_cache_dtype", "bf16"),
                                              **toggle),
            "prompt_len": W.SelectionSlider(options=CONTROL_OPTIONS["prompt_len"], value=get("prompt_len", 1024),
                                            description="prompt length", continuous_update=False, **wide),
            "num_prompts": W.BoundedIntText(value=get("num_prompts", 32), min=CONTROL_OPTIONS["num_prompts"][0],
                                            max=n_max, description="prompts (all at once)", **narrow),
            "concurrency": W.BoundedIntText(value=get("concurrency") or get("num_prompts", 32), min=1, max=n_max,
                                            description="concurrency", **narrow),
            "weight_dtype": W.ToggleButtons(options=sorted(WEIGHT_DTYPES, reverse=True),
                                            value=get("weight_dtype", SEED_DEPLOYMENT.weight_dtype), **toggle),
            "moe_parallel": W.ToggleButtons(options=list(MOE_PARALLEL),
                                            value=get("moe_parallel", SEED_DEPLOYMENT.moe_parallel), **toggle),
            "strategy": W.Dropdown(options=list(EXPLORER_STRATEGIES), description="strategy", **wide,
                                   value=resolve_strategy(get("strategy", PR_STRATEGY))),
            "gpu_memory_utilization": W.BoundedFloatText(value=get("gpu_memory_utilization", 0.9), min=0.05, max=1.0,
                                                         step=0.05, description="GPU memory utilization", **narrow),
            "memory_budget_mib": W.BoundedFloatText(value=get("memory_budget_mib", 300.0), min=0, max=1e6, step=50,
                                                    description="advise: budget MiB", **narrow),
        }
        self.summary, self.measured_out, self.advice_out = W.HTML(), W.HTML(), W.HTML()
        self.chart = W.Image(format="png")
        self.advice = self.deployment = self.result = None
        self.error, self._hold = "", False
        self.controls["concurrency"].max = self.controls["num_prompts"].value
        self.controls["num_prompts"].observe(self._on_num_prompts, names="value")
        self.controls["model"].observe(self._on_model, names="value")
        for name, c in self.controls.items():
            if name != "model":
                c.observe(lambda _: None if self._hold else self.update(), names="value")
        def labelled(text, w):  # ToggleButtons' own description wraps above the buttons; a fixed label does not
            return W.HBox([W.HTML(f"<div style='width:150px;text-align:right;padding-right:8px'>{text}</div>"), w])

        labels = {"kv_cache_dtype": "KV-cache dtype", "strategy": "strategy", "weight_dtype": "weight dtype",
                  "moe_parallel": "MoE layout (ep: -ep)"}
        rows = [labelled(labels[k], c) if k in labels else c for k, c in self.controls.items()]
        self.widget = W.VBox([*rows, self.summary, self.chart, self.measured_out, self.advice_out])
        self.update()

    def values(self) -> dict:
        """The current control values (:data:`DEPLOYMENT_CONTROLS`, ``strategy`` and ``memory_budget_mib``)."""
        return {k: c.value for k, c in self.controls.items()}

    @contextlib.contextmanager
    def _holding(self):
        """Control changes inside do not re-render (their observers skip :meth:`update`); yields the hold before."""
        outer, self._hold = self._hold, True
        try:
            yield outer
        finally:
            self._hold = outer

    def _on_model(self, change):
        tp = self.controls["tp"]
        try:
            opts = tp_options(change["new"])
        except ValueError as e:  # a broken config.json: say so instead of keeping the last model's numbers
            self._show_error(str(e))
            return
        with self._holding() as outer:
            tp.options, tp.value = opts, tp.value if tp.value in opts else (8 if 8 in opts else opts[-1])
        if not outer:
            self.update()

    def _on_num_prompts(self, change):
        with self._holding():  # concurrency never exceeds the prompts (vllm bench serve's limit); the widget clamps it
            c = self.controls["concurrency"]
            was_all = c.value == change["old"]
            c.max = change["new"]
            if was_all:
                c.value = change["new"]

    def set(self, **values) -> dict:
        """Set several controls as a user would (a model change re-offers TP sizes), then render once; returns
        :attr:`result`. ValueError: an unknown control, or a value its widget does not offer.
        """
        unknown = sorted(set(values) - set(self.controls))
        if unknown:
            raise ValueError(f"unknown control(s) {unknown}; allowed: {list(self.controls)}")
        try:
            with self._holding():
                if "model" in values:
                    self.controls["model"].value = values.pop("model")  # its observer re-offers the TP sizes
                for k, v in values.items():
                    opts = getattr(self.controls[k], "options", None)
                    if opts is not None and v not in opts:
                        raise ValueError(f"{k}={v!r} is not offered; allowed: {list(opts)}")
                    self.controls[k].value = v
        except ValueError:
            raise
        except Exception as e:  # traitlets raises TraitError for out-of-range values
            raise ValueError(f"cannot set {values}: {e}") from None
        self.update()
        return self.result

    def update(self) -> dict | None:
        """Recompute from the controls and re-render the outputs in place. A rejected selection is shown as an error
        message (``error``) instead of raising."""
        try:
            self.deployment = Deployment.of(**{k: self.controls[k].value for k in DEPLOYMENT_CONTROLS})  # the door
            self.result = explore_point(self.deployment, self.controls["strategy"].value, measured=self.measured)
            self.error = ""
        except ValueError as e:
            self._show_error(str(e))
            return None
        self.summary.value = summary_html(self.result)
        self.chart.value = render_chart(self.result)
        self.measured_out.value = measured_html(self.result)
        self.advice_out.value = self._advise()
        return self.result

    def _advise(self) -> str:
        """The advice panel: :func:`mla_lab.sweep.advise.advise` for the selected deployment and budget."""
        try:
            self.advice = advise(self.deployment, memory_budget_mib=self.values()["memory_budget_mib"],
                                 measured=self.measured)
        except ValueError as e:
            self.advice = None
            return f"<b>Advice:</b> {html.escape(str(e))}"
        return ("<b>Advice</b><pre style='white-space:pre;overflow-x:auto;max-width:100%'>"  # scrolls, never wraps
                + html.escape(format_advice(self.advice)) + "</pre>")

    def _show_error(self, message: str) -> None:
        self.result, self.error = None, message
        self.summary.value = f"<b style='color:#b00'>Cannot price this selection:</b> {html.escape(message)}"
        self.chart.value, self.measured_out.value, self.advice_out.value = b"", "", ""

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
