"""The report: its data, figures, tables, the published site and the browser check.

- :mod:`.data` — measured and modelled rows, validation data, failed points.
- :mod:`.figures` — matplotlib figures (no pyplot state), published as PNG + SVG.
- :mod:`.tables` — pandas tables and their HTML.
- :mod:`.site` — the ``reports/`` site: per-run reports, latest copy, index.
- :mod:`.browser` — headless Chromium check of a published page.
"""

from .data import combine, failed_points, load_measured, load_validation, measured_for, ok_rows, pick
from .figures import (
    not_fitting,
    plot_deployment,
    plot_frontier_grid,
    plot_heatmap,
    plot_tp_bars,
    plot_validation,
    publish_figure,
)
from .seed_answer import seed_answer, seed_answer_table, seed_comm_sensitivity, seed_sentences
from .tables import (
    html_table,
    provenance_html,
    provenance_summary,
    save_provenance,
    seed_setup_table,
    summary_html,
    summary_table,
    validation_table,
)
from .tp_ranks import comm_fit_table, tp_rank_table, tp_status_table

__all__ = ["combine", "failed_points", "load_measured", "load_validation", "measured_for", "ok_rows", "pick",
           "not_fitting", "plot_deployment", "plot_frontier_grid", "plot_heatmap", "plot_tp_bars", "plot_validation",
           "publish_figure", "html_table", "provenance_html", "provenance_summary", "save_provenance",
           "seed_setup_table", "summary_html", "summary_table", "tp_status_table", "tp_rank_table", "comm_fit_table",
           "seed_comm_sensitivity", "validation_table", "seed_answer", "seed_answer_table", "seed_sentences"]
