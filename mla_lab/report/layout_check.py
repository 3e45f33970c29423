"""Is anything a reader needs cut off at the figure's edge? Legends and titles checked on the drawn Figure.

A figure saved without ``bbox_inches="tight"`` keeps only what lies inside the figure's box: a legend anchored
outside the axes (``bbox_to_anchor=(1.3, 1)``) or a title pushed above the top is silently cut in the PNG and SVG.
:func:`figure_clipping` draws the figure with the Agg renderer (its layout engine runs, as in ``savefig``) and
returns one line per legend, axes title, figure suptitle or sub-figure title whose window extent leaves the
figure's box by more than ``tol_px`` pixels. :func:`label_overlaps` returns one line per pair of labels of one
axes that print over each other (tick labels, bar labels and other texts placed on the axes).
:func:`mla_lab.report.figures.publish_figure` refuses a figure with either.
"""

from __future__ import annotations

__all__ = ["figure_clipping", "label_overlaps", "TOLERANCE_PX", "OVERLAP_PX"]

#: How far (pixels at the figure's dpi) an artist's box may leave the figure's box before it counts as clipped.
TOLERANCE_PX = 1.0
#: How far (pixels, both ways) two labels' boxes may overlap before they count as printed over each other.
OVERLAP_PX = 1.0


def _text_ok(t) -> bool:
    return t is not None and t.get_visible() and bool(t.get_text().strip())


def _artists(fig, axis_labels: bool = False):
    """(label, artist) for every legend and title of ``fig``, its axes and sub-figures (and, with
    ``axis_labels``, every axis label: x/y labels of each axes, colour bars included)."""
    out = []

    def walk(f, where):
        sup = getattr(f, "_suptitle", None)
        if _text_ok(sup):
            out.append((f"{where}suptitle {sup.get_text()!r}", sup))
        for lg in getattr(f, "legends", []):
            if lg.get_visible():
                out.append((f"{where or 'figure '}legend", lg))
        for i, ax in enumerate(f.axes):
            if not ax.get_visible():
                continue
            name = f"{where}axes {i + 1}"
            for loc in ("left", "center", "right"):
                t = ax._left_title if loc == "left" else ax.title if loc == "center" else ax._right_title
                if _text_ok(t):
                    out.append((f"{name} title {t.get_text()!r}", t))
            if axis_labels:
                for axis in (ax.xaxis, ax.yaxis):
                    if _text_ok(axis.label):
                        out.append((f"{name} {axis.axis_name}label {axis.label.get_text()!r}", axis.label))
            lg = ax.get_legend()
            if lg is not None and lg.get_visible():
                title = lg.get_title().get_text()
                out.append((f"{name} legend" + (f" {title!r}" if title else ""), lg))
        for j, sf in enumerate(getattr(f, "subfigs", [])):
            walk(sf, f"{where}subfigure {j + 1} ")

    walk(fig, "")
    if axis_labels:
        for attr, what in (("_supxlabel", "supxlabel"), ("_supylabel", "supylabel")):
            t = getattr(fig, attr, None)
            if _text_ok(t):
                out.append((f"{what} {t.get_text()!r}", t))
    # axes of sub-figures are listed in fig.axes too: keep the first (most specific) label of each artist
    seen, uniq = set(), []
    for label, a in sorted(out, key=lambda x: -x[0].count("subfigure")):
        if id(a) not in seen:
            seen.add(id(a))
            uniq.append((label, a))
    return uniq


def figure_clipping(fig, tol_px: float = TOLERANCE_PX, axis_labels: bool = False) -> list[str]:
    """Lines naming every legend or title of ``fig`` that lies (partly) outside the figure, [] when none does;
    ``axis_labels`` adds the axis labels (colour-bar labels included).

    Each line names the artist, how many pixels it sticks out on which side, and the fix. The figure is drawn once
    with the Agg renderer (its canvas is restored afterwards).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    old = fig.canvas
    canvas = FigureCanvasAgg(fig)
    try:
        canvas.draw()
        renderer = canvas.get_renderer()
        W, H = fig.bbox.width, fig.bbox.height
        problems = []
        for label, artist in _artists(fig, axis_labels):
            bb = artist.get_window_extent(renderer)
            out = {"left": -bb.x0, "right": bb.x1 - W, "bottom": -bb.y0, "top": bb.y1 - H}
            sides = [f"{px:.0f} px past the {side}" for side, px in out.items() if px > tol_px]
            if sides:
                problems.append(f"{label} is clipped: {', '.join(sides)} edge of the {W:.0f} x {H:.0f} px figure "
                                "(move it inside, or make room: layout='constrained', fig.subplots_adjust)")
        return problems
    finally:
        fig.set_canvas(old)


def _axes_texts(ax, renderer):
    """(label, window box) of every visible, non-empty tick label and text (bar labels, annotations) of ``ax``."""
    out = []
    for axis in (ax.xaxis, ax.yaxis):
        for t in axis.get_ticklabels(which="both"):
            if _text_ok(t):
                out.append((f"{axis.axis_name}-tick label {t.get_text()!r}", t.get_window_extent(renderer)))
    for t in ax.texts:
        if _text_ok(t):
            out.append((f"label {t.get_text()!r}", t.get_window_extent(renderer)))
    return out


def label_overlaps(fig, tol_px: float = OVERLAP_PX) -> list[str]:
    """Lines naming every pair of labels of one axes of ``fig`` whose boxes overlap by more than ``tol_px`` pixels
    in both directions (tick labels over tick labels, a bar label over another or over a tick label), [] when
    none do. The figure is drawn once with the Agg renderer (its canvas is restored afterwards)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    old = fig.canvas
    canvas = FigureCanvasAgg(fig)
    try:
        canvas.draw()
        renderer = canvas.get_renderer()
        problems = []
        for i, ax in enumerate(fig.axes):
            if not ax.get_visible():
                continue
            items = _axes_texts(ax, renderer)
            for a in range(len(items)):
                for b in range(a + 1, len(items)):
                    (la, ba), (lb, bb) = items[a], items[b]
                    if la[0] != lb[0] and la[1:6] == "-tick" and lb[1:6] == "-tick":
                        continue  # an x and a y tick label meeting at the axes' corner: matplotlib's own layout
                    dx = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
                    dy = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
                    if dx > tol_px and dy > tol_px:
                        problems.append(f"axes {i + 1}: {la} and {lb} overlap ({dx:.0f} x {dy:.0f} px; fewer or "
                                        "rotated ticks, smaller labels or a wider figure)")
        return problems
    finally:
        fig.set_canvas(old)
