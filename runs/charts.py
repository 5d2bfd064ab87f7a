"""Server-side metric charts: one inline SVG line chart per metric key (SPEC F2, F29).

A chart is a polyline of step (x) against value (y) with both axes labelled
with their minimum and maximum. Non-finite values (NaN, ±Infinity) are valid
metric values but cannot be drawn: they are skipped and counted so the page
can say how many are missing. At most ``MAX_POINTS`` points are drawn per key;
the database does the heavy reduction (``selectors.metric_chart_series``) and
``downsample`` bounds whatever reaches this module. Data stages (F20) are
drawn as vertical markers at their start steps, with a tooltip saying what
changed.
"""

import math
from dataclasses import dataclass

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from runs import selectors
from runs.models import Run

MAX_POINTS = 1000
WIDTH, HEIGHT = 640, 240
# Room for the value labels on the left and the step labels below the plot.
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 28


@dataclass(frozen=True)
class Chart:
    """One rendered chart: ``svg`` is safe markup; counts are points of the key, not pixels."""

    key: str
    svg: SafeString
    drawn: int
    skipped: int
    total: int

    @property
    def downsampled(self) -> bool:
        """True when fewer points are drawn than the key holds finite values."""
        return self.drawn < self.total - self.skipped


def downsample(points: list[tuple[float, float]], max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``max_points`` of ``points`` (ordered by x), keeping each bucket's lowest and highest value.

    The x range is cut into ``max_points // 2`` buckets of equal width; within
    a bucket the two kept points stay in their original order, so the line's
    shape and its spikes survive. Fewer points come back unchanged.
    """
    if len(points) <= max_points:
        return list(points)
    buckets = max(max_points // 2, 1)
    x0, x1 = points[0][0], points[-1][0]
    span = (x1 - x0) or 1
    kept: dict[int, tuple[int, int]] = {}
    for index, (x, y) in enumerate(points):
        bucket = min(int((x - x0) / span * buckets), buckets - 1)
        if bucket not in kept:
            kept[bucket] = (index, index)
            continue
        lo, hi = kept[bucket]
        kept[bucket] = (index if y < points[lo][1] else lo, index if y > points[hi][1] else hi)
    indexes = sorted({i for pair in kept.values() for i in pair})
    return [points[i] for i in indexes]


def _label(number: float) -> str:
    return f"{number:.4g}"


PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def scale(low: float, high: float, size: float, flip: bool):
    """``(low, high, f)``: ``f`` maps [low, high] onto [0, size] (reversed when ``flip``, for a y axis)."""
    if high == low:
        # A flat series sits in the middle rather than on an axis.
        low, high = low - (abs(low) or 1.0) * 0.05, high + (abs(high) or 1.0) * 0.05
    ratio = size / (high - low)
    if flip:
        return low, high, lambda v: size - (v - low) * ratio
    return low, high, lambda v: (v - low) * ratio


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``step`` (a data stage's start step, F20) with ``label`` as its tooltip."""

    step: int
    label: str


def render_svg(key: str, points: list[tuple[float, float]], markers: list[Marker] = ()) -> SafeString:
    """The ``<svg>`` of finite ``points`` (x ordered); an empty plot area says so through ``data-empty``."""
    if not points:
        return _svg_frame(key, [])
    return _svg_frame(key, points, lambda sx, sy: _series(points, sx, sy), markers=markers)


def _markers(markers: list[Marker], low: float, high: float, sx) -> SafeString:
    """One ``<g class="data-stage-marker">`` per marker whose step lies within the drawn step range."""
    drawn = []
    for marker in markers:
        if not low <= marker.step <= high:
            continue
        x = LEFT + sx(marker.step)
        drawn.append(format_html(
            '<g class="data-stage-marker" data-step="{}"><title>{}</title>'
            '<line x1="{x}" y1="{t}" x2="{x}" y2="{b}"/><text x="{tx}" y="{ty}">{}</text></g>',
            marker.step, marker.label, marker.step, x=f"{x:.1f}", t=TOP, b=TOP + PLOT_H, tx=f"{x + 3:.1f}", ty=TOP + 10,
        ))
    return mark_safe("".join(drawn))


def data_stage_markers(*, run: Run) -> list[Marker]:
    """A ``Marker`` per data stage of ``run`` at its start step, labelled with what it added and removed (F20)."""
    markers = []
    for item in selectors.data_stage_history(run=run):
        changes = [f"+{v.dataset.name}:{v.version}" for v in item["added"]]
        changes += [f"−{v.dataset.name}:{v.version}" for v in item["removed"]]
        step = item["stage"].start_step
        label = _("Data change at step %(step)s") % {"step": step}
        markers.append(Marker(step=step, label=f"{label}: {' '.join(changes)}" if changes else label))
    return markers


def _series(points, sx, sy, *, css: str = "series", attrs: SafeString = mark_safe("")) -> SafeString:
    coords = " ".join(f"{LEFT + sx(x):.1f},{TOP + sy(y):.1f}" for x, y in points)
    if len(points) > 1:
        return format_html('<polyline class="{}"{} points="{}"/>', css, attrs, coords)
    x, y = coords.split(",")
    dot_css = css.replace("series", "series-dot", 1)
    return format_html('<circle class="{}"{} cx="{}" cy="{}" r="3"/>', dot_css, attrs, x, y)


def svg_open(label: str, *, empty: bool) -> SafeString:
    """The opening ``<svg>`` of a chart titled ``label`` (``data-empty`` when nothing is drawn) and its two axes."""
    head = format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" role="img" aria-label="{}"'
        ' preserveAspectRatio="xMidYMid meet"{}><title>{}</title>',
        WIDTH, HEIGHT, label, mark_safe(' data-empty="true"' if empty else ""), label,
    )
    axes = format_html(
        '<g class="axes"><line x1="{l}" y1="{t}" x2="{l}" y2="{b}"/><line x1="{l}" y1="{b}" x2="{r}" y2="{b}"/></g>',
        l=LEFT, t=TOP, b=TOP + PLOT_H, r=LEFT + PLOT_W,
    )
    return mark_safe(head + axes)


def _svg_frame(key: str, points: list[tuple[float, float]], draw=None, markers: list[Marker] = ()) -> SafeString:
    """Axes, min/max labels of ``points``, ``markers`` within the step range and what ``draw(sx, sy)`` returns,
    where ``sx``/``sy`` map a step / value to plot coordinates (relative to the plot's top left corner)."""
    frame = svg_open(key, empty=not points)
    if not points:
        return mark_safe(frame + "</svg>")
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x_low, x_high, sx = scale(min(xs), max(xs), PLOT_W, flip=False)
    _y_low, _y_high, sy = scale(min(ys), max(ys), PLOT_H, flip=True)
    labels = format_html(
        '<g class="labels">'
        '<text class="y-max" x="{lx}" y="{t}" dy="0.8em" text-anchor="end">{ymax}</text>'
        '<text class="y-min" x="{lx}" y="{b}" text-anchor="end">{ymin}</text>'
        '<text class="x-min" x="{l}" y="{by}" text-anchor="start">{xmin}</text>'
        '<text class="x-max" x="{r}" y="{by}" text-anchor="end">{xmax}</text>'
        "</g>",
        lx=LEFT - 6, t=TOP, b=TOP + PLOT_H, l=LEFT, r=LEFT + PLOT_W, by=HEIGHT - 8,
        ymax=_label(max(ys)), ymin=_label(min(ys)), xmin=_label(min(xs)), xmax=_label(max(xs)),
    )
    lines = _markers(markers, x_low, x_high, sx)
    return mark_safe(frame + lines + draw(sx, sy) + labels + "</svg>")


def build_chart(key: str, points, *, skipped: int = 0, total: int | None = None, markers: list[Marker] = ()) -> Chart:
    """A ``Chart`` of ``points`` ((step, value) pairs by step) with ``markers``; non-finite values are skipped
    and counted."""
    finite = [(s, v) for s, v in points if v is not None and math.isfinite(v)]
    skipped += len(points) - len(finite)
    drawn = downsample(finite, MAX_POINTS)
    total = total if total is not None else len(points)
    return Chart(key=key, svg=render_svg(key, drawn, markers), drawn=len(drawn), skipped=skipped, total=total)


def run_charts(*, run: Run) -> list[Chart]:
    """One ``Chart`` per metric key of ``run``, keys sorted, with its data stages as markers (Overview tab)."""
    charts = []
    markers = data_stage_markers(run=run)
    for key in selectors.metric_keys(run=run):
        points, skipped, total = selectors.metric_chart_series(run=run, key=key, max_points=MAX_POINTS)
        charts.append(build_chart(key, points, skipped=skipped, total=total, markers=markers))
    return charts


# --- "Show with ancestors" (SPEC F2): a resumed Run's curves joined with its parent chain's ------------------

LINEAGE_STROKES = 6  # CSS classes lineage-0 … lineage-5, cycled


@dataclass(frozen=True)
class LineageRun:
    """One Run of the drawn chain (oldest first); ``stroke`` its CSS class suffix (``lineage-<stroke>``: an index
    for an ancestor, ``current`` for the Run itself), ``until_step`` where its points were cut (None: not cut)."""

    run: Run
    stroke: str
    until_step: int | None
    is_current: bool


@dataclass(frozen=True)
class _Segment:
    lineage: LineageRun
    points: list[tuple[float, float]]


def render_lineage_svg(key: str, segments: list[_Segment], markers: list[Marker] = ()) -> SafeString:
    """The ``<svg>`` of one key over a chain of Runs: one polyline per Run (its own stroke), all on one
    scale, each starting at the previous Run's last drawn point so the curves join into one line (F2)."""
    everything = [p for segment in segments for p in segment.points]

    def draw(sx, sy):
        lines, previous = [], None
        for segment in segments:
            if not segment.points:
                continue
            item = segment.lineage
            css = f"series lineage-{item.stroke}" + ("" if item.is_current else " ancestor")
            attrs = format_html(' data-run="{}" data-points="{}"', item.run.pk, len(segment.points))
            lines.append(_series(([previous] if previous else []) + segment.points, sx, sy, css=css, attrs=attrs))
            previous = segment.points[-1]
        return mark_safe("".join(lines))

    return _svg_frame(key, everything, draw, markers=markers)


def lineage_runs(*, user, run: Run) -> list[LineageRun]:
    """``run``'s ancestors (oldest first) and ``run`` itself, each with its stroke and cut step."""
    chain = selectors.run_ancestors(user=user, run=run) + [(run, None)]
    return [
        LineageRun(
            run=item, stroke="current" if item.pk == run.pk else str(index % LINEAGE_STROKES), until_step=until,
            is_current=item.pk == run.pk,
        )
        for index, (item, until) in enumerate(chain)
    ]


def run_charts_with_ancestors(*, user, run: Run) -> tuple[list[Chart], list[LineageRun]]:
    """One ``Chart`` per metric key of ``run`` and its ancestors, each ancestor's points drawn up to (not
    including) the step where its child resumed, then the child's (SPEC F2); plus the legend's Runs."""
    lineage = lineage_runs(user=user, run=run)
    # Each Run's data stages, an ancestor's only below the step its child resumed at (what the chain trained on).
    markers = [
        marker for item in lineage for marker in data_stage_markers(run=item.run)
        if item.until_step is None or marker.step < item.until_step
    ]
    keys = sorted({key for item in lineage for key in selectors.metric_keys(run=item.run)})
    per_segment = max(MAX_POINTS // len(lineage), 2)
    charts = []
    for key in keys:
        segments, skipped, total = [], 0, 0
        for item in lineage:
            points, bad, count = selectors.metric_chart_series(
                run=item.run, key=key, max_points=per_segment, before_step=item.until_step
            )
            segments.append(_Segment(lineage=item, points=[(s, v) for s, v in points]))
            skipped, total = skipped + bad, total + count
        drawn = sum(len(segment.points) for segment in segments)
        svg = render_lineage_svg(key, segments, markers)
        charts.append(Chart(key=key, svg=svg, drawn=drawn, skipped=skipped, total=total))
    return charts, lineage
