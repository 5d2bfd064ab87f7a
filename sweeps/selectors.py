"""Reads of Sweeps and their trials for pages, API and the claim service (docs/design/sweeps.md#sweeps, #requeue).

A trial's metric is the last value (highest step, then latest stored) of the
sweep's ``metric_name`` logged by the trial's Run, read for all trials in
one query (a correlated subquery on the ``(run, key, step)`` index).
"""

import math

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from mado.errors import NotFound
from runs.models import MetricSummary, Project, RunStatus
from sweeps.models import MetricGoal, Sweep, SweepTrial, TrialState


def _with_counts(sweeps: QuerySet[Sweep]) -> QuerySet[Sweep]:
    counts = {f"trials_{state}": Count("trials", filter=Q(trials__state=state)) for state in TrialState.values}
    return sweeps.annotate(trials_total=Count("trials"), **counts)


def trial_counts_of(sweep: Sweep) -> dict[str, int]:
    """``{queued, leased, running, done, total}`` of a Sweep fetched through ``sweep_list`` / ``sweep_get_for_user``."""
    counts = {state: getattr(sweep, f"trials_{state}") for state in TrialState.values}
    return {**counts, "total": sweep.trials_total}


def sweep_list(*, user, project: Project | None = None) -> QuerySet[Sweep]:
    """Sweeps of the user's Projects (of ``project`` when given), newest first, with their trial counts."""
    sweeps = Sweep.objects.visible_to(user).select_related("project", "created_by")
    if project is not None:
        sweeps = sweeps.filter(project=project)
    return _with_counts(sweeps).order_by("-created_at", "-id")


def sweep_get_for_user(*, user, sweep_id) -> Sweep:
    """The Sweep ``sweep_id`` in one of the user's Projects, with its trial counts; else ``NotFound`` (404)."""
    try:
        sweep_id = int(sweep_id)
    except (TypeError, ValueError):
        raise NotFound(f"sweep {sweep_id!r} not found", field="sweep") from None
    sweep = _with_counts(
        Sweep.objects.visible_to(user).select_related("project", "created_by").filter(pk=sweep_id)
    ).first()
    if sweep is None:
        raise NotFound(f"sweep {sweep_id} not found", field="sweep")
    return sweep


def sweep_trial_counts(*, sweep: Sweep) -> dict[str, int]:
    """``{queued, leased, running, done, total}``: how many trials of ``sweep`` are in each state, read now."""
    return trial_counts_of(_with_counts(Sweep.objects.filter(pk=sweep.pk)).get())


def sweep_trial_get(*, sweep: Sweep, number) -> SweepTrial:
    """Trial ``number`` of ``sweep`` (visibility checked with the Sweep) with its Run; else ``NotFound``."""
    trial = SweepTrial.objects.select_related("run", "sweep__project").filter(sweep=sweep, number=number).first()
    if trial is None:
        raise NotFound(f"sweep {sweep.pk} has no trial {number}", field="number")
    return trial


def sweep_trials(*, sweep: Sweep) -> list[SweepTrial]:
    """The trials of ``sweep`` by number, each with its Run, its ``earlier_runs`` (failed attempts before a retry)
    and ``metric``: the last value of the sweep's metric the Run logged (None when it logged none, or the last
    one was NaN)."""
    last = MetricSummary.objects.filter(run_id=OuterRef("run_id"), key=sweep.metric_name).values("last_value")
    return list(
        SweepTrial.objects.filter(sweep=sweep)
        .select_related("run")
        .prefetch_related("earlier_runs")
        .annotate(metric=Subquery(last))
        .order_by("number")
    )


def has_final_metric(trial: SweepTrial) -> bool:
    """Whether ``trial`` (from ``sweep_trials``) has a result: its Run finished with a finite ``metric``. A running,
    preempted or crashed trial's last value is partial."""
    return trial.run.status == RunStatus.FINISHED and trial.metric is not None and math.isfinite(trial.metric)


def sweep_best_trial(*, sweep: Sweep, trials: list[SweepTrial]) -> SweepTrial | None:
    """The trial of ``trials`` (from ``sweep_trials``) whose Run finished with the best finite metric for the
    sweep's goal, the lowest number on a tie; None when no finished trial has one. A running, preempted or
    crashed trial's last value is a partial result and never "best"."""
    scored = [trial for trial in trials if has_final_metric(trial)]
    if not scored:
        return None
    sign = -1 if sweep.metric_goal == MetricGoal.MAXIMIZE else 1
    return min(scored, key=lambda trial: (sign * trial.metric, trial.number))


def sweep_finished_results(*, sweep: Sweep) -> list[tuple[dict, float]]:
    """``(parameters, metric)`` of the trials whose Run finished with a finite metric (what the samplers learn from)."""
    return [(trial.parameters, trial.metric) for trial in sweep_trials(sweep=sweep) if has_final_metric(trial)]


def trial_latest_checkpoint(*, trial: SweepTrial):
    """The newest (highest step) usable Checkpoint of the trial's Run, which its next program resumes from; or None."""
    return trial.run.checkpoints.usable().order_by("-step").first()
