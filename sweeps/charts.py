"""The Sweep page's scatter plots as data for uPlot: the sweep's metric (y) against each searched parameter (x).

The server picks what to draw; ``static/scatter.js`` draws it with uPlot
(hover names the trial, drag-zoom, double click resets), like the metric
charts (``runs.charts``). A numeric parameter is drawn on a linear x axis
(logarithmic for ``log_uniform_values``) spanning the searched space; a
parameter with listed non-numeric values gets one slot per value, labelled.
Trials without a finite metric are not drawn. Each dot is one of three
series: the best trial, other trials whose Run finished, and trials whose Run
has not finished (running, preempted, crashed…: their value is partial),
drawn hollow.
"""

import math
from dataclasses import dataclass

from django.utils.translation import gettext as _

from sweeps.models import Sweep, SweepTrial
from sweeps.selectors import has_final_metric

KINDS = ("final", "best", "partial")


@dataclass(frozen=True)
class Scatter:
    """One parameter's plot: ``data`` is what ``static/scatter.js`` draws, ``drawn`` how many trials have a dot."""

    parameter: str
    data: dict
    drawn: int


def _label(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _axis(spec: dict, values: list) -> dict:
    """The x axis of one parameter: ``{"categories": [labels]}`` for listed non-numeric values (x = slot index),
    else ``{"log": bool, "domain": [low, high]}`` spanning the searched space and the values tried."""
    if not all(_is_number(v) for v in spec.get("values", [0])):
        return {"categories": [_label(v) for v in spec["values"]], "log": False, "domain": None}
    domain = [*values, *spec.get("values", []), *(spec[bound] for bound in ("min", "max") if bound in spec)]
    if not domain:
        return {"categories": None, "log": False, "domain": None}
    log = spec.get("distribution") == "log_uniform_values" and min(domain) > 0
    return {"categories": None, "log": log, "domain": [min(domain), max(domain)]}


def _kind(trial: SweepTrial, best: SweepTrial | None) -> str:
    if best is not None and trial.pk == best.pk:
        return "best"
    return "final" if has_final_metric(trial) else "partial"


def _point(trial: SweepTrial, parameter: str, metric_name: str, axis: dict, best: SweepTrial | None) -> dict:
    value = trial.parameters.get(parameter)
    kind = _kind(trial, best)
    label = _("Trial %(number)s: %(parameter)s = %(value)s, %(metric)s %(score)s") % {
        "number": trial.number,
        "parameter": parameter,
        "value": _label(value),
        "metric": metric_name,
        "score": _label(trial.metric),
    }
    if kind == "partial":
        label += " " + _("(partial: the run is %(status)s)") % {"status": trial.run.get_status_display()}
    if axis["categories"] is not None:
        labels = axis["categories"]
        x = labels.index(_label(value)) if _label(value) in labels else 0
    else:
        x = value
    return {"trial": trial.number, "x": x, "y": trial.metric, "kind": kind, "label": label}


def sweep_scatters(*, sweep: Sweep, trials: list[SweepTrial], best: SweepTrial | None) -> list[Scatter]:
    """One ``Scatter`` per searched parameter of ``sweep`` (a fixed ``value`` is left out), by name; ``trials``
    come from ``selectors.sweep_trials`` (with ``metric``). Each ``data`` holds ``parameter``, the x axis
    (``categories`` or ``log`` + ``domain``) and ``points`` (``trial``, ``x``, ``y``, ``kind`` of ``KINDS``,
    ``label`` for the hover line)."""
    scored = [trial for trial in trials if trial.metric is not None and math.isfinite(trial.metric)]
    scatters = []
    for name in sorted(sweep.parameters):
        spec = sweep.parameters[name]
        if "value" in spec:
            continue
        drawn = [trial for trial in scored if name in trial.parameters]
        axis = _axis(spec, [trial.parameters[name] for trial in drawn if _is_number(trial.parameters[name])])
        points = [_point(trial, name, sweep.metric_name, axis, best) for trial in drawn]
        scatters.append(Scatter(parameter=name, data={"parameter": name, **axis, "points": points}, drawn=len(drawn)))
    return scatters


def scatter_data(*, sweep: Sweep, scatters: list[Scatter]) -> dict:
    """The JSON-ready payload of the page (``json_script`` "scatter-data"): the plots and the series' names."""
    return {
        "metric": sweep.metric_name,
        "kinds": {"final": _("finished"), "best": _("best trial"), "partial": _("not finished (partial)")},
        "scatters": [scatter.data for scatter in scatters],
    }
