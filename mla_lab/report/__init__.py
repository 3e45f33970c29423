"""The report: its data, figures, tables, the published site and the browser check.

The names below are loaded on first use (PEP 562): ``import mla_lab.report.site`` does not load pandas or
matplotlib (the CLI's ``index`` and ``--help`` stay fast, issue 22).
"""

from __future__ import annotations

import importlib

#: public name -> the submodule that defines it.
_WHERE = {
    **dict.fromkeys(("combine", "failed_points", "load_measured", "load_measured_cached", "load_validation",
                     "measured_for", "ok_rows", "pick"), "data"),
    **dict.fromkeys(("kv_dtype_note", "not_fitting", "plot_deployment", "plot_frontier_grid", "plot_heatmap", "plot_tp_bars",
                     "plot_validation"), "figures"),
    "publish_figure": "cache",
    # ``seed_answer`` (the function) is not listed: ``mla_lab.report.seed_answer`` is its module, and a submodule
    # import rebinds the package attribute, so the function would depend on import order; import it from there
    **dict.fromkeys(("seed_answer_table", "seed_comm_sensitivity", "seed_sentences"), "seed_answer"),
    **dict.fromkeys(("html_table", "provenance_html", "provenance_summary", "save_provenance", "seed_setup_table",
                     "summary_html", "summary_table", "validation_table"), "tables"),
    **dict.fromkeys(("comm_fit_table", "tp_rank_table", "tp_status_table"), "tp_ranks"),
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
