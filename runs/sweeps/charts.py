"""The Sweep page's scatter plots: the sweep's metric (y) against each searched parameter (x), one dot per trial.

Server-rendered inline SVG in the style of ``runs.charts`` (same size,
margins and min/max labels). A numeric parameter is drawn on a linear axis
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

from runs.charts import HEIGHT, LEFT, PLOT_H, PLOT_W, TOP, scale, svg_open
from runs.models import Sweep, SweepTrial
from runs.sweeps.selectors import has_final_metric

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
