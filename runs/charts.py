"""Metric charts as data for the browser's uPlot charts (docs/design/resume.md#steps-continue;
docs/design/interfaces.md#surfaces, #workspace).

The server picks what to draw and reduces it; ``static/charts.js`` draws it
with uPlot (hover values, drag-zoom, log scale, smoothing, step or wall-time
x axis). A ``Chart`` is one metric key: one ``Series`` per Run drawn (one on
the Run page, a chain of Runs with "Show with ancestors", the selected Runs
on the Compare page), each at most ``MAX_POINTS`` points reduced in the
database by ``selectors.metric_chart_series`` (min and max per step bucket,
so spikes survive). Non-finite values (NaN, ±Infinity) cannot be drawn: they
are counted so the page can say how many are missing. ``Marker``s are data
stages (docs/design/runs.md#data-stages) and resume points (docs/design/resume.md#steps-continue), drawn as vertical
lines.
"""

import math
from dataclasses import dataclass, field, replace

from django.db.models import Q
from django.utils.translation import gettext as _

from runs import selectors
from runs.models import Run, SegmentPoint
from runs.segments import bits_to_values

MAX_POINTS = 1000


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``step``: ``kind`` "data" (a data stage's start step, docs/design/runs.md#data-stages) or
    "resume" (where a child Run took over, docs/design/resume.md#steps-continue); ``label`` is its tooltip."""

    step: int
    label: str
    kind: str = "data"


@dataclass(frozen=True)
class Series:
    """One Run's curve of a key: ``points`` are ``(step, value, timestamp_ms)`` with finite values, by step;
    ``color`` an index into the page's palette; ``dashed`` for an ancestor's part of a chain."""

    run_id: int
    label: str
    color: int
    points: list[tuple[int, float, int]]
    dashed: bool = False


@dataclass(frozen=True)
class Chart:
    """One metric key: its ``series``; counts are points of the key (all series), not pixels."""

    key: str
    series: list[Series]
    skipped: int
    total: int
    markers: list[Marker] = field(default_factory=list)

    @property
    def drawn(self) -> int:
        """How many points the browser receives for this key."""
        return sum(len(s.points) for s in self.series)

    @property
    def downsampled(self) -> bool:
        """True when fewer points are sent than the key holds finite values."""
        return self.drawn < self.total - self.skipped


def chart_data(charts: list[Chart]) -> dict:
    """The JSON-ready payload that ``static/charts.js`` draws: per key its series as column arrays
    (``x`` steps, ``t`` Unix seconds, ``y`` values) and its markers."""
    return {
        "charts": [
            {
                "key": chart.key,
                "series": [
                    {
                        "run": s.run_id,
                        "label": s.label,
                        "color": s.color,
                        "dashed": s.dashed,
                        "x": [p[0] for p in s.points],
                        "t": [p[2] / 1000 for p in s.points],
                        "y": [p[1] for p in s.points],
                    }
                    for s in chart.series
                ],
                "markers": [{"step": m.step, "label": m.label, "kind": m.kind} for m in chart.markers],
            }
            for chart in charts
        ]
    }


def data_stage_markers(*, run: Run) -> list[Marker]:
    """A ``Marker`` per data stage of ``run`` at its start step, labelled with what it added and removed
    (docs/design/runs.md#data-stages)."""
    markers = []
    for item in selectors.data_stage_history(run=run):
        changes = [f"+{v.dataset.name}:{v.version}" for v in item["added"]]
        changes += [f"−{v.dataset.name}:{v.version}" for v in item["removed"]]
        step = item["stage"].start_step
        label = _("Data change at step %(step)s") % {"step": step}
        markers.append(Marker(step=step, label=f"{label}: {' '.join(changes)}" if changes else label))
    return markers


def _series(run: Run, key: str, *, color: int, max_points: int, before_step=None, dashed=False, label=None):
    points, skipped, total = selectors.metric_chart_series_remembered(
        run=run, key=key, max_points=max_points, before_step=before_step
    )
    name = label or run.name or run.external_id
    return Series(run_id=run.pk, label=name, color=color, points=list(points), dashed=dashed), skipped, total


def _within(markers, series: list[Series]) -> list[Marker]:
    """The ``markers`` whose step lies within the steps drawn by ``series`` (others would widen the axis)."""
    steps = [p[0] for s in series for p in s.points]
    return [m for m in markers if steps and min(steps) <= m.step <= max(steps)]


SYSTEM_PREFIX = "system/"


def is_system_key(key: str) -> bool:
    """True for the SDK's system metrics (``system/…``, docs/design/interfaces.md#system-metrics), shown on the System
    tab, not with training's."""
    return key.startswith(SYSTEM_PREFIX)


def runs_charts(
    *, runs: list[Run], markers: list[Marker] = (), max_points: int = MAX_POINTS, system: bool = False
) -> list[Chart]:
    """One ``Chart`` per metric key logged in any of ``runs``, keys sorted, one series per Run that has the key
    (colour = the Run's position in ``runs``), each at most ``max_points`` points (Run page, Compare page).
    ``system``: only the system metrics' keys, else only the others."""
    system_keys = Q(key__startswith=SYSTEM_PREFIX)
    found = selectors.metric_chart_series_many(
        runs=runs, max_points=max_points, keys=system_keys if system else ~system_keys
    )
    charts = []
    for key in sorted({key for _run_id, key in found}):
        series, skipped, total = [], 0, 0
        for index, run in enumerate(runs):
            if (run.pk, key) in found:
                points, bad, count = found[(run.pk, key)]
                series.append(Series(run_id=run.pk, label=run.name or run.external_id, color=index, points=points))
                skipped, total = skipped + bad, total + count
        charts.append(Chart(key=key, series=series, skipped=skipped, total=total, markers=_within(markers, series)))
    return charts


def run_charts(*, run: Run, system: bool = False) -> list[Chart]:
    """One ``Chart`` per metric key of ``run``, keys sorted, with its data stages as markers: the training
    metrics (Overview tab) or, with ``system``, the system metrics (System tab). A Run resumed under its id also
    shows, dashed, what each resume logged again below its floor, with a marker where it resumed
    (docs/design/resume.md#same-run-parity)."""
    if system or not run.resume_count:
        return runs_charts(runs=[run], markers=data_stage_markers(run=run), system=system)
    resumed_at = [
        Marker(step=floor, kind="resume", label=_("Resumed at step %(step)s") % {"step": floor})
        for floor in run.resume_segments.values_list("floor", flat=True)
    ]
    charts = runs_charts(runs=[run], markers=data_stage_markers(run=run) + resumed_at)
    replayed = segment_series(run=run)
    return [
        replace(chart, series=chart.series + replayed[chart.key]) if chart.key in replayed else chart
        for chart in charts
    ]


def segment_series(*, run: Run, max_points: int = MAX_POINTS) -> dict[str, list[Series]]:
    """``{key: [Series]}``: per key, one dashed series per resume segment of ``run`` holding the finite values it
    logged again below its floor (docs/design/resume.md#same-run-parity), colour its number, at most
    ``max_points`` points (evenly thinned), timestamps the segment's start (points kept apart carry none). One
    query, bounded by what the resumes replayed."""
    rows = (
        SegmentPoint.objects.filter(segment__run=run)
        .order_by("segment__number", "key", "step")
        .values_list("segment__number", "segment__created_at", "key", "step", "value_bits")
    )
    rows = list(rows)
    values = bits_to_values([row[-1] for row in rows]).tolist()
    grouped: dict[tuple[str, int], tuple[int, list]] = {}
    for (number, created_at, key, step, _bits), value in zip(rows, values):
        points = grouped.setdefault((key, number), (int(created_at.timestamp() * 1000), []))[1]
        if math.isfinite(value):
            points.append((step, value))
    found: dict[str, list[Series]] = {}
    for (key, number), (stamp, points) in grouped.items():
        stride = max(1, math.ceil(len(points) / max_points))
        drawn = [(step, value, stamp) for step, value in points[::stride]]
        label = _("Resume %(number)s, logged again") % {"number": number}
        found.setdefault(key, []).append(Series(run_id=run.pk, label=label, color=number, points=drawn, dashed=True))
    return found


# --- "Show with ancestors" (docs/design/resume.md#steps-continue): a resumed Run's curves with its parents' -----------


@dataclass(frozen=True)
class LineageRun:
    """One Run of the drawn chain (oldest first); ``color`` its palette index (the Run itself is 0, the
    page's accent), ``until_step`` where its points were cut (None: not cut)."""

    run: Run
    color: int
    until_step: int | None
    is_current: bool


def lineage_runs(*, user, run: Run) -> list[LineageRun]:
    """``run``'s ancestors (oldest first) and ``run`` itself, each with its colour and cut step."""
    chain = selectors.run_ancestors(user=user, run=run) + [(run, None)]
    return [
        LineageRun(
            run=item, color=0 if item.pk == run.pk else index + 1, until_step=until, is_current=item.pk == run.pk
        )
        for index, (item, until) in enumerate(chain)
    ]


def run_charts_with_ancestors(*, user, run: Run) -> tuple[list[Chart], list[LineageRun]]:
    """One ``Chart`` per metric key of ``run`` and its ancestors, each ancestor's points drawn up to (not
    including) the step where its child resumed, then the child's (docs/design/resume.md#steps-continue); plus the
    legend's Runs. Resume points are markers next to the data stages each Run trained on."""
    lineage = lineage_runs(user=user, run=run)
    markers = [
        marker
        for item in lineage
        for marker in data_stage_markers(run=item.run)
        if item.until_step is None or marker.step < item.until_step
    ]
    markers += [
        Marker(step=item.until_step, kind="resume", label=_("Resumed at step %(step)s") % {"step": item.until_step})
        for item in lineage
        if item.until_step is not None
    ]
    keys = sorted({key for item in lineage for key in selectors.metric_keys(run=item.run) if not is_system_key(key)})
    per_segment = max(MAX_POINTS // len(lineage), 2)
    charts = []
    for key in keys:
        series, skipped, total = [], 0, 0
        for item in lineage:
            one, bad, count = _series(
                item.run,
                key,
                color=item.color,
                max_points=per_segment,
                before_step=item.until_step,
                dashed=not item.is_current,
            )
            series.append(one)
            skipped, total = skipped + bad, total + count
        charts.append(Chart(key=key, series=series, skipped=skipped, total=total, markers=_within(markers, series)))
    return charts, lineage
