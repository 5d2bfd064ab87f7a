"""Metric conditions evaluated as a batch arrives, and the stalled-loop check (docs/design/alerts.md#metric-rules).

``rules_after_batch`` runs after every metrics batch commits, so it must be
cheap: one query finds the Project's metric rules on the batch's keys (none:
done), each rule reads its key's slice of the sorted batch in numpy, and a
row is written only when something changed (a run of points beyond a
threshold, a stalled-loop rule's last-point time once per tenth of its
period) or a rule fires.
"""

from datetime import timedelta

import numpy as np
from django.db.models import Q
from django.utils import timezone

from alerts.models import Event, MetricWatch, Rule
from alerts.services.firing import fire_safely
from runs.models import Run, RunStatus

WATCHED = (Event.METRIC_ABOVE, Event.METRIC_BELOW, Event.METRIC_STALLED)


def longest_run(beyond: np.ndarray, carried: int) -> tuple[int, int]:
    """``(longest, trailing)`` runs of True in ``beyond``, the first run extended by ``carried`` earlier points."""
    if beyond.all():
        return carried + len(beyond), carried + len(beyond)
    falses = np.flatnonzero(~beyond)
    edges = np.concatenate(([-1], falses, [len(beyond)]))
    gaps = np.diff(edges) - 1
    gaps[0] += carried
    return int(gaps.max()), int(gaps[-1])


def _threshold(rule: Rule, run: Run, values: np.ndarray, steps: np.ndarray, watch: MetricWatch) -> None:
    beyond = values > rule.threshold if rule.event == Event.METRIC_ABOVE else values < rule.threshold
    longest, trailing = longest_run(beyond, watch.in_a_row)
    if trailing != watch.in_a_row:
        MetricWatch.objects.filter(pk=watch.pk).update(in_a_row=trailing)
    if longest >= rule.consecutive:
        side = "above" if rule.event == Event.METRIC_ABOVE else "below"
        fire_safely(
            rule=rule,
            run=run,
            condition=f"{rule.key} {side} {rule.threshold:g} x{rule.consecutive}",
            title=f"{rule.key} {side} {rule.threshold:g} for {rule.consecutive} points in a row",
            text=f"Run {run.name or run.external_id}: {rule.key} = {values[-1]:g} at step {int(steps[-1])}.",
        )


def _nonfinite(rule: Rule, run: Run, values: np.ndarray, steps: np.ndarray) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.argmax(bad))
        fire_safely(
            rule=rule,
            run=run,
            condition=f"{rule.key} not finite",
            title=f"{rule.key} is {values[first]} at step {int(steps[first])}",
            text=f"Run {run.name or run.external_id} logged a non-finite {rule.key}.",
            level="error",
        )


def _watches(rules: list[Rule], run: Run) -> dict[int, MetricWatch]:
    watched = [rule.pk for rule in rules if rule.event in WATCHED]
    if not watched:
        return {}
    found = {w.rule_id: w for w in MetricWatch.objects.filter(run=run, rule_id__in=watched)}
    missing = [MetricWatch(rule_id=pk, run=run) for pk in watched if pk not in found]
    if missing:
        MetricWatch.objects.bulk_create(missing, ignore_conflicts=True)
        found = {w.rule_id: w for w in MetricWatch.objects.filter(run=run, rule_id__in=watched)}
    return found


def _seen(rule: Rule, watch: MetricWatch, now) -> None:
    refresh = timedelta(minutes=rule.stalled_minutes or 0) / 10
    if watch.last_point_at is None or watch.last_point_at < now - refresh:
        MetricWatch.objects.filter(pk=watch.pk).update(last_point_at=now)


def rules_after_batch(*, run: Run, steps: dict, batch) -> None:
    """Evaluate the metric rules of ``run``'s Project on a committed batch (``batch``: a
    ``runs.metric_batch.SortedBatch``; ``steps``: its keys' first and last steps)."""
    rules = list(
        Rule.objects.filter(
            project_id=run.project_id, enabled=True, event__in=[e.value for e in (Event.METRIC_NONFINITE, *WATCHED)]
        )
        .filter(key__in=list(steps))
        .select_related("project", "owner")
    )
    if not rules:
        return
    index = {key: g for g, key in enumerate(batch.keys)}
    watches, now = _watches(rules, run), timezone.now()
    for rule in rules:
        g = index[rule.key]
        start, stop = int(batch.starts[g]), int(batch.starts[g] + batch.counts[g])
        values, at = batch.values[start:stop], batch.steps[start:stop]
        if rule.event == Event.METRIC_NONFINITE:
            _nonfinite(rule, run, values, at)
        elif rule.event == Event.METRIC_STALLED:
            _seen(rule, watches[rule.pk], now)
        else:
            _threshold(rule, run, values, at, watches[rule.pk])


def stalled_runs_check(*, now=None) -> int:
    """Fire every stalled-loop rule for each running Run of its Project that logged no point of the rule's key for
    the rule's ``stalled_minutes`` (counted from the Run's start when it never did); how many fired (beat).

    A stall is one condition per last point, so the same stall fires once and a later one again.
    """
    now = now or timezone.now()
    fired = 0
    for rule in Rule.objects.filter(event=Event.METRIC_STALLED, enabled=True).select_related("project", "owner"):
        cutoff = now - timedelta(minutes=rule.stalled_minutes or 0)
        last = {w.run_id: w.last_point_at for w in MetricWatch.objects.filter(rule=rule)}
        running = Run.objects.filter(project_id=rule.project_id, status=RunStatus.RUNNING).filter(
            Q(started_at__lt=cutoff) | Q(started_at__isnull=True, created_at__lt=cutoff)
        )
        for run in running.select_related("created_by"):
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
