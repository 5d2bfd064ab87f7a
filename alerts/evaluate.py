"""Metric conditions evaluated as a batch arrives, and the stalled-loop check (docs/design/alerts.md#metric-rules).

``rules_after_batch`` runs after every metrics batch commits, so its usual
path asks the database nothing: the Project's metric rules come from a
per-process cache (``MADO_ALERT_RULE_CACHE_SECONDS``; a rule created or
deleted in this process applies at once, in another within that time),
each rule reads its key's slice of the sorted batch in numpy, and a row is
read or written only when a point is beyond a rule's threshold or not
finite. A run of points beyond a threshold that ended the previous batch
counts on in this one only when no batch of that key came in between
(``_carried``). The stalled-loop check (beat) reads the Runs' metric
summaries: no work per batch.
"""

import time
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import numpy as np
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from alerts.models import Event, MetricWatch, Rule
from alerts.services.firing import fire_safely
from runs.models import MetricChunk, MetricSummary, Run, RunStatus

BATCH_EVENTS = (Event.METRIC_NONFINITE, Event.METRIC_ABOVE, Event.METRIC_BELOW)


class RulePlan(NamedTuple):
    id: int
    event: str
    key: str
    threshold: float | None
    consecutive: int


_PLANS: dict[int, tuple[float, list[RulePlan]]] = {}


def forget_rules(project_id: int | None = None) -> None:
    """Drop this process's cached metric rules of ``project_id`` (None: of every Project)."""
    if project_id is None:
        _PLANS.clear()
    else:
        _PLANS.pop(project_id, None)


def _plans(project_id: int) -> list[RulePlan]:
    cached = _PLANS.get(project_id)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    rows = Rule.objects.filter(project_id=project_id, enabled=True, event__in=[e.value for e in BATCH_EVENTS])
    plans = [RulePlan(*row) for row in rows.values_list("pk", "event", "key", "threshold", "consecutive")]
    _PLANS[project_id] = (time.monotonic() + settings.MADO_ALERT_RULE_CACHE_SECONDS, plans)
    return plans


def longest_run(beyond: np.ndarray, carried: int) -> tuple[int, int]:
    """``(longest, trailing)`` runs of True in ``beyond``, the first run extended by ``carried`` earlier points."""
    if beyond.all():
        return carried + len(beyond), carried + len(beyond)
    falses = np.flatnonzero(~beyond)
    edges = np.concatenate(([-1], falses, [len(beyond)]))
    gaps = np.diff(edges) - 1
    gaps[0] += carried
    return int(gaps.max()), int(gaps[-1])


def _carried(plan: RulePlan, run: Run, first_step: int) -> int:
    """Points beyond the threshold that ended the key's previous batch, 0 when another batch came in between."""
    watch = MetricWatch.objects.filter(rule_id=plan.id, run=run).values_list("in_a_row", "last_step").first()
    if not watch or not watch[0]:
        return 0
    between = MetricChunk.objects.filter(
        run_id=run.pk, key=plan.key, last_step__gt=watch[1], last_step__lt=first_step
    ).exists()
    return 0 if between else watch[0]


def _fire(plan: RulePlan, run: Run, **message) -> None:
    rule = Rule.objects.select_related("project", "owner").filter(pk=plan.id).first()
    if rule is not None:
        fire_safely(rule=rule, run=run, **message)


def _threshold(plan: RulePlan, run: Run, values: np.ndarray, steps: np.ndarray) -> None:
    above = plan.event == Event.METRIC_ABOVE
    beyond = values > plan.threshold if above else values < plan.threshold
    if not beyond.any():
        return  # a run stored earlier is judged stale by the next batch that starts beyond (``_carried``)
    carried = _carried(plan, run, int(steps[0])) if beyond[0] else 0
    longest, trailing = longest_run(beyond, carried)
    MetricWatch.objects.update_or_create(
        rule_id=plan.id, run=run, defaults={"in_a_row": trailing, "last_step": int(steps[-1])}
    )
    if longest >= plan.consecutive:
        side = "above" if above else "below"
        _fire(
            plan,
            run,
            condition=f"{plan.key} {side} {plan.threshold:g} x{plan.consecutive}",
            title=f"{plan.key} {side} {plan.threshold:g} for {plan.consecutive} points in a row",
            text=f"Run {run.name or run.external_id}: {plan.key} = {values[-1]:g} at step {int(steps[-1])}.",
        )


def _nonfinite(plan: RulePlan, run: Run, values: np.ndarray, steps: np.ndarray) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.argmax(bad))
        _fire(
            plan,
            run,
            condition=f"{plan.key} not finite",
            title=f"{plan.key} is {values[first]} at step {int(steps[first])}",
            text=f"Run {run.name or run.external_id} logged a non-finite {plan.key}.",
            level="error",
        )


def rules_after_batch(*, run: Run, steps: dict, batch) -> None:
    """Evaluate the metric rules of ``run``'s Project on a committed batch (``batch``: a
    ``runs.metric_batch.SortedBatch``; ``steps``: its keys' first and last steps)."""
    plans = [plan for plan in _plans(run.project_id) if plan.key in steps]
    if not plans:
        return
    index = {key: g for g, key in enumerate(batch.keys)}
    for plan in plans:
        g = index[plan.key]
        start, stop = int(batch.starts[g]), int(batch.starts[g] + batch.counts[g])
        values, at = batch.values[start:stop], batch.steps[start:stop]
        if plan.event == Event.METRIC_NONFINITE:
            _nonfinite(plan, run, values, at)
        else:
            _threshold(plan, run, values, at)


def _last_points(rule: Rule, runs: list[Run]) -> dict[int, datetime]:
    rows = MetricSummary.objects.filter(run__in=runs, key=rule.key).values_list("run_id", "last_timestamp")
    return {run_id: datetime.fromtimestamp(ms / 1000, tz=UTC) for run_id, ms in rows}


def stalled_runs_check(*, now=None) -> int:
    """Fire every stalled-loop rule for each running Run of its Project whose last point of the rule's key (its
    timestamp as logged) is older than the rule's ``stalled_minutes`` (counted from the Run's start when it
    logged none); how many fired (beat).

    A stall is one condition per last point, so the same stall fires once and a later one again.
    """
    now = now or timezone.now()
    fired = 0
    for rule in Rule.objects.filter(event=Event.METRIC_STALLED, enabled=True).select_related("project", "owner"):
        cutoff = now - timedelta(minutes=rule.stalled_minutes or 0)
        running = list(
            Run.objects.filter(project_id=rule.project_id, status=RunStatus.RUNNING)
            .filter(Q(started_at__lt=cutoff) | Q(started_at__isnull=True, created_at__lt=cutoff))
            .select_related("created_by")
        )
        last = _last_points(rule, running)
        for run in running:
            seen = last.get(run.pk) or run.started_at or run.created_at
            if seen >= cutoff:
                continue
            firing = fire_safely(
                rule=rule,
                run=run,
                condition=f"{rule.key} stalled since {seen.isoformat(timespec='seconds')}",
                title=f"No new {rule.key} for {rule.stalled_minutes:g} minutes",
                text=f"Run {run.name or run.external_id} is running but logged no {rule.key} since "
                f"{seen:%Y-%m-%d %H:%M:%S} UTC.",
            )
            fired += firing is not None
    return fired
