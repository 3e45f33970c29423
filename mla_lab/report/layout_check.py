"""Is anything a reader needs cut off at the figure's edge, or printed over another label? Checked on the drawn
Figure (a PNG no longer knows where its legend was); :func:`mla_lab.report.cache.publish_figure` refuses a figure
with either."""

from __future__ import annotations

from contextlib import contextmanager

__all__ = ["figure_clipping", "label_overlaps", "drawn", "TOLERANCE_PX", "OVERLAP_PX"]

#: How far (pixels at the figure's dpi) an artist's box may leave the figure's box before it counts as clipped.
TOLERANCE_PX = 1.0
#: How far (pixels, both ways) two labels' boxes may overlap before they count as printed over each other.
OVERLAP_PX = 1.0


@contextmanager
def drawn(fig):
    """The renderer of ``fig`` drawn once with Agg (its layout engine runs, as in ``savefig``); the figure's canvas
    is restored afterwards."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    old = fig.canvas
    canvas = FigureCanvasAgg(fig)
    try:
        canvas.draw()
        yield canvas.get_renderer()
    finally:
        fig.set_canvas(old)


def _text_ok(t) -> bool:
    return t is not None and t.get_visible() and bool(t.get_text().strip())


def _axes_artists(ax, name: str, axis_labels: bool) -> list:
    """(label, artist) of ``ax``'s titles, legend and (``axis_labels``) x/y labels."""
    out = [(f"{name} title {t.get_text()!r}", t) for t in (ax._left_title, ax.title, ax._right_title) if _text_ok(t)]
    if axis_labels:
        out += [(f"{name} {a.axis_name}label {a.label.get_text()!r}", a.label) for a in (ax.xaxis, ax.yaxis)
                if _text_ok(a.label)]
    lg = ax.get_legend()
    if lg is not None and lg.get_visible():
        title = lg.get_title().get_text()
        out.append((f"{name} legend" + (f" {title!r}" if title else ""), lg))
    return out


def _walk(f, where: str, axis_labels: bool) -> list:
    """(label, artist) of the suptitle, legends and axes of figure or sub-figure ``f``, its sub-figures too."""
    sup = getattr(f, "_suptitle", None)
    out = [(f"{where}suptitle {sup.get_text()!r}", sup)] if _text_ok(sup) else []
    out += [(f"{where or 'figure '}legend", lg) for lg in getattr(f, "legends", []) if lg.get_visible()]
    for i, ax in enumerate(f.axes):
        if ax.get_visible():
            out += _axes_artists(ax, f"{where}axes {i + 1}", axis_labels)
    for j, sf in enumerate(getattr(f, "subfigs", [])):
        out += _walk(sf, f"{where}subfigure {j + 1} ", axis_labels)
    return out


def _artists(fig, axis_labels: bool = False):
    """(label, artist) for every legend and title of ``fig``, its axes and sub-figures (and, with ``axis_labels``,
    every axis label, colour bars and sup-labels included), each artist once under its most specific label."""
    out = _walk(fig, "", axis_labels)
    if axis_labels:
        out += [(f"{what} {t.get_text()!r}", t) for what, t in (("supxlabel", getattr(fig, "_supxlabel", None)),
                                                               ("supylabel", getattr(fig, "_supylabel", None)))
                if _text_ok(t)]
    uniq = {}  # axes of sub-figures are listed in fig.axes too
    for label, a in sorted(out, key=lambda x: -x[0].count("subfigure")):
        uniq.setdefault(id(a), (label, a))
    return list(uniq.values())


def figure_clipping(fig, tol_px: float = TOLERANCE_PX, axis_labels: bool = False) -> list[str]:
    """One line per legend or title of ``fig`` (``axis_labels``: axis labels too) lying more than ``tol_px`` outside
    the figure, naming the artist, how far past which side, and the fix; [] when none does."""
    problems = []
    with drawn(fig) as renderer:
        W, H = fig.bbox.width, fig.bbox.height
        for label, artist in _artists(fig, axis_labels):
            bb = artist.get_window_extent(renderer)
            out = {"left": -bb.x0, "right": bb.x1 - W, "bottom": -bb.y0, "top": bb.y1 - H}
            sides = [f"{px:.0f} px past the {side}" for side, px in out.items() if px > tol_px]
            if sides:
                problems.append(f"{label} is clipped: {', '.join(sides)} edge of the {W:.0f} x {H:.0f} px figure "
                                "(move it inside, or make room: layout='constrained', fig.subplots_adjust)")
    return problems


def _axes_texts(ax, renderer):
    """(label, window box) of every visible, non-empty tick label and text (bar labels, annotations) of ``ax``."""
    out = [(f"{axis.axis_name}-tick label {t.get_text()!r}", t.get_window_extent(renderer))
           for axis in (ax.xaxis, ax.yaxis) for t in axis.get_ticklabels(which="both") if _text_ok(t)]
    return out + [(f"label {t.get_text()!r}", t.get_window_extent(renderer)) for t in ax.texts if _text_ok(t)]


def overlap(a, b) -> tuple[float, float]:
    """How far two window boxes overlap, ``(dx, dy)`` in pixels (negative: apart)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)


def label_overlaps(fig, tol_px: float = OVERLAP_PX) -> list[str]:
    """One line per pair of labels of one axes of ``fig`` overlapping by more than ``tol_px`` both ways (tick labels,
    bar labels, annotations; an x and a y tick label meeting at the corner excepted); [] when none do."""
    problems = []
    with drawn(fig) as renderer:
        for i, ax in enumerate(fig.axes):
            items = _axes_texts(ax, renderer) if ax.get_visible() else []
            for a, (la, ba) in enumerate(items):
                for lb, bb in items[a + 1:]:
                    if la[0] != lb[0] and la[1:6] == "-tick" and lb[1:6] == "-tick":
                        continue  # an x and a y tick label meeting at the axes' corner: matplotlib's own layout
                    dx, dy = overlap(ba, bb)
                    if dx > tol_px and dy > tol_px:
                        problems.append(f"axes {i + 1}: {la} and {lb} overlap ({dx:.0f} x {dy:.0f} px; fewer or "
                                        "rotated ticks, smaller labels or a wider figure)")
    return problems
