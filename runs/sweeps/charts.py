"""The Sweep page's scatter plots: the sweep's metric (y) against each searched parameter (x), one dot per trial.

Server-rendered inline SVG (min/max labels); the metric charts are uPlot's
(``runs.charts``), this plot is not yet. A numeric parameter is drawn on a linear axis
(logarithmic for ``log_uniform_values``) spanning the searched space, a
parameter with listed non-numeric values on one slot per value, labelled.
Trials without a finite metric are not drawn; the best trial's dot is
ringed, and a trial whose Run has not finished (its value is partial:
running, preempted, crashed…) is drawn hollow. Dots keep ``DOT_PAD`` pixels
off the axis lines.
"""

import math
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from runs.models import Sweep, SweepTrial
from runs.sweeps.selectors import has_final_metric

WIDTH, HEIGHT = 640, 240
# Room for the value labels on the left and the parameter labels below the plot.
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 28
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
MAX_CATEGORY_LABELS = 12
DOT_PAD = 8  # pixels between the outermost dots and the plot's edges


@dataclass(frozen=True)
class Scatter:
    """One parameter's plot: ``svg`` is safe markup, ``drawn`` how many trials have a dot."""

    parameter: str
    svg: SafeString
    drawn: int


def _label(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def scale(low: float, high: float, size: float, flip: bool):
    """``(low, high, f)``: ``f`` maps [low, high] onto [0, size] (reversed when ``flip``, for a y axis)."""
    if high == low:
        # A flat series sits in the middle rather than on an axis.
        low, high = low - (abs(low) or 1.0) * 0.05, high + (abs(high) or 1.0) * 0.05
    ratio = size / (high - low)
    if flip:
        return low, high, lambda v: size - (v - low) * ratio
    return low, high, lambda v: (v - low) * ratio


def svg_open(label: str, *, empty: bool) -> SafeString:
    """The opening ``<svg>`` of a plot titled ``label`` (``data-empty`` when nothing is drawn) and its two axes."""
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


def _x_positions(spec: dict, values: list):
    """``(position of each value, x-axis labels as (x, text))`` for one parameter's values."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in spec.get("values", [0]))
    if not numeric:
        slots = {repr(v): i for i, v in enumerate(spec["values"])}
        step = PLOT_W / len(slots)
        positions = [step * (slots.get(repr(v), 0) + 0.5) for v in values]
        every = max(1, math.ceil(len(slots) / MAX_CATEGORY_LABELS))
        labels = [(step * (i + 0.5), _label(v)) for i, v in enumerate(spec["values"]) if i % every == 0]
        return positions, labels
    log = spec.get("distribution") == "log_uniform_values"
    # The axis spans the searched space (listed values, min/max), not only the values tried so far.
    domain = [*values, *spec.get("values", []), *(spec[bound] for bound in ("min", "max") if bound in spec)]
    position = math.log10 if log else float
    sx = scale(min(map(position, domain)), max(map(position, domain)), PLOT_W - 2 * DOT_PAD, flip=False)[2]
    low, high = min(domain), max(domain)
    ends = [(DOT_PAD, _label(low)), (PLOT_W - DOT_PAD, _label(high))]
    labels = ends if low != high else [(PLOT_W / 2, _label(low))]
    return [DOT_PAD + sx(position(v)) for v in values], labels


def _dot(trial: SweepTrial, parameter: str, x: float, y: float, best: SweepTrial | None) -> SafeString:
    tooltip = _("Trial %(number)s: %(parameter)s = %(value)s, metric %(metric)s") % {
        "number": trial.number, "parameter": parameter, "value": _label(trial.parameters.get(parameter)),
        "metric": _label(trial.metric),
    }
    css = "trial"
    if best is not None and trial.pk == best.pk:
        css = "trial best"
    elif not has_final_metric(trial):
        css = "trial partial"
        tooltip += " " + _("(partial: the run is %(status)s)") % {"status": trial.run.get_status_display()}
    return format_html(
        '<circle class="{}" data-trial="{}" cx="{}" cy="{}" r="4"><title>{}</title></circle>',
        css, trial.number, f"{x:.1f}", f"{y:.1f}", tooltip,
    )


def render_scatter(*, parameter: str, spec: dict, trials: list[SweepTrial], best: SweepTrial | None) -> SafeString:
    """The ``<svg>`` of ``trials`` (each with a finite ``metric``): metric against ``parameter``."""
    frame = svg_open(parameter, empty=not trials)
    if not trials:
        return mark_safe(frame + "</svg>")
    xs, x_labels = _x_positions(spec, [trial.parameters.get(parameter) for trial in trials])
    metrics = [trial.metric for trial in trials]
    sy = scale(min(metrics), max(metrics), PLOT_H - 2 * DOT_PAD, flip=True)[2]
    dots = mark_safe("".join(
        _dot(trial, parameter, LEFT + x, TOP + DOT_PAD + sy(trial.metric), best)
        for trial, x in zip(trials, xs, strict=True)
    ))
    labels = format_html(
        '<g class="labels"><text class="y-max" x="{lx}" y="{t}" dy="0.8em" text-anchor="end">{}</text>'
        '<text class="y-min" x="{lx}" y="{b}" text-anchor="end">{}</text>{}</g>',
        _label(max(metrics)), _label(min(metrics)),
        format_html_join("", '<text class="x-label" x="{}" y="{}" text-anchor="middle">{}</text>',
                         ((f"{LEFT + x:.1f}", HEIGHT - 8, text) for x, text in x_labels)),
        lx=LEFT - 6, t=TOP, b=TOP + PLOT_H,
    )
    return mark_safe(frame + dots + labels + "</svg>")


def sweep_scatters(*, sweep: Sweep, trials: list[SweepTrial], best: SweepTrial | None) -> list[Scatter]:
    """One ``Scatter`` per searched parameter of ``sweep`` (a fixed ``value`` is left out), by name; ``trials``
    come from ``selectors.sweep_trials`` (with ``metric``)."""
    scored = [trial for trial in trials if trial.metric is not None and math.isfinite(trial.metric)]
    scatters = []
    for name in sorted(sweep.parameters):
        spec = sweep.parameters[name]
        if "value" in spec:
            continue
        drawn = [trial for trial in scored if name in trial.parameters]
        svg = render_scatter(parameter=name, spec=spec, trials=drawn, best=best)
        scatters.append(Scatter(parameter=name, svg=svg, drawn=len(drawn)))
    return scatters
