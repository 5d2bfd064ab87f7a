"""What the alerts app does on the events of ``runs.hooks`` (docs/design/house.md#arrows; docs/design/alerts.md#rules).

Every receiver fires in its own savepoint and swallows its errors
(``fire_safely``): an alert never fails the reaper, a Job's end or a batch.
"""

import logging

from django.db import transaction
from django.utils import timezone

from alerts.evaluate import rules_after_batch
from alerts.models import Event, Failure
from alerts.reliability import LOST_STATES, last_alive
from alerts.services.delivery import delivery_give_up, delivery_waits
from alerts.services.firing import DELIVER_TASK, fire_safely, rules_for
from mado import outbox
from runs import hooks
from runs.models import Run

logger = logging.getLogger("alerts")

ENDED = {"crashed": Event.CRASHED, "failed": Event.FAILED, "preempted": Event.PREEMPTED, "finished": Event.FINISHED}


def _fire(event: str, run, *, condition: str, title: str, text: str = "", level: str = "warn") -> None:
    for rule in rules_for(project_id=run.project_id, event=event):
        fire_safely(rule=rule, run=run, condition=condition, title=title, text=text, level=level)


def _name(run) -> str:
    return run.name or run.external_id


def ended_condition(run) -> str:
    """The condition of ``run``'s end: its status, then ``after resume #N`` once resumed by id N times, so each
    segment's end is its own occurrence (docs/design/alerts.md#rules)."""
    return run.status if not run.resume_count else f"{run.status} after resume #{run.resume_count}"


def _record_failure(run) -> None:
    """Keep ``run``'s lost segment as a ``Failure`` (once per segment), in a savepoint whose error is logged."""
    if run.status not in LOST_STATES or run.ended_at is None:
        return
    try:
        with transaction.atomic():
            Failure.objects.get_or_create(
                run=run,
                segment=run.resume_count,
                defaults={
                    "status": run.status,
                    "started_at": (run.writer_since if run.resume_count else None) or run.started_at or run.created_at,
                    "ended_at": run.ended_at,
                    "last_alive_at": last_alive(run),
                    "reason": run.ended_reason[:500],
                },
            )
    except Exception:  # noqa: BLE001 - the reaper or a Job's end must go on
        logger.exception("the failure of run %s could not be recorded", run.pk)


def alerts_on_run_ended(sender, *, run, **kwargs) -> None:
    """``run`` ended: its lost segment is recorded and the rules on its final status fire (crashed, failed,
    preempted, finished), once per segment (``ended_condition``)."""
    _record_failure(run)
    event = ENDED.get(run.status)
    if event is not None:
        level = "info" if event == Event.FINISHED else "error"
        title = f"Run {_name(run)} {run.status}"
        _fire(event, run, condition=ended_condition(run), title=title, text=run.ended_reason, level=level)


def alerts_on_run_started(sender, *, run, **kwargs) -> None:
    """``run`` started; a resumed one (a parent, or reopened under its id) fires the ``resumed`` rules, and a
    resume by id links the lost segment it follows (``Failure.resumed_at``)."""
    if run.resume_count:
        try:
            with transaction.atomic():
                Failure.objects.filter(run=run, segment=run.resume_count - 1, resumed_at__isnull=True).update(
                    resumed_at=run.writer_since or timezone.now()
                )
        except Exception:  # noqa: BLE001 - a resume must go on
            logger.exception("the resume of run %s could not be linked to its failure", run.pk)
    if run.parent_id or run.resume_count:
        _fire(
            Event.RESUMED,
            run,
            condition=f"resumed #{run.resume_count}",
            title=f"Run {_name(run)} resumed",
            level="info",
        )


def alerts_on_metrics(sender, *, run, steps, batch=None, **kwargs) -> None:
    """A batch of ``run`` committed: the metric rules on its keys are evaluated (``alerts.evaluate``)."""
    if batch is not None:
        rules_after_batch(run=run, steps=steps, batch=batch)


def alerts_on_parity(sender, *, parity, previous, **kwargs) -> None:
    """A parity verdict changed; ``diverged`` fires the parity rules of the resumed Run."""
    if parity.verdict == "diverged" and previous != "diverged":
        run = Run.objects.select_related("project", "created_by").get(pk=parity.run_id)
        text = f"{parity.key} at step {parity.step}: parent {parity.parent_value}, resumed {parity.child_value}"
        _fire(
            Event.PARITY_DIVERGED,
            run,
            condition=f"parity diverged at {parity.key} step {parity.step}",
            title=f"Run {_name(run)} diverged from its parent",
            text=text,
        )


def alerts_on_checkpoint_refused(sender, *, checkpoint, reason, **kwargs) -> None:
    """A checkpoint ended ``error``: the checkpoint rules of its Run fire (one condition per step)."""
    run = Run.objects.select_related("project", "created_by").get(pk=checkpoint.run_id)
    title = f"Checkpoint at step {checkpoint.step} of run {_name(run)} refused"
    _fire(Event.CHECKPOINT_REFUSED, run, condition=f"checkpoint {checkpoint.step}", title=title, text=reason)


def alerts_on_checkpoint_corrupt(sender, *, checkpoint, reason, **kwargs) -> None:
    """A scrub found a complete checkpoint's stored bytes changed (docs/design/checkpoints.md#scrubbing): its Run's
    rules fire (one condition per step), at level ``error``: the checkpoint is no longer offered for resume."""
    run = Run.objects.select_related("project", "created_by").get(pk=checkpoint.run_id)
    _fire(
        Event.CHECKPOINT_CORRUPT,
        run,
        condition=f"checkpoint {checkpoint.step} corrupt",
        title=f"Stored checkpoint at step {checkpoint.step} of run {_name(run)} is corrupt",
        text=f"{reason}. It is no longer offered for resume; resume from an earlier checkpoint.",
        level="error",
    )


def alerts_on_job_given_up(sender, *, job, reason, **kwargs) -> None:
    """A Job never ran (no worker took it): the Job rules of its Run fire."""
    run = job.run
    _fire(
        Event.JOB_GIVEN_UP,
        run,
        condition=f"job {job.pk} given up",
        title=f"Job of run {_name(run)} given up",
        text=reason,
        level="error",
    )


def connect() -> None:
    """Connect the receivers above and the delivery's outbox hooks; called once from ``AlertsConfig.ready``."""
    hooks.run_ended.connect(alerts_on_run_ended, dispatch_uid="alerts.run_ended")
    hooks.run_started.connect(alerts_on_run_started, dispatch_uid="alerts.run_started")
    hooks.metrics_stored.connect(alerts_on_metrics, dispatch_uid="alerts.metrics_stored")
    hooks.parity_changed.connect(alerts_on_parity, dispatch_uid="alerts.parity_changed")
    hooks.checkpoint_refused.connect(alerts_on_checkpoint_refused, dispatch_uid="alerts.checkpoint_refused")
    hooks.checkpoint_corrupt.connect(alerts_on_checkpoint_corrupt, dispatch_uid="alerts.checkpoint_corrupt")
    hooks.job_given_up.connect(alerts_on_job_given_up, dispatch_uid="alerts.job_given_up")
    outbox.register(DELIVER_TASK, waiting=delivery_waits, give_up=delivery_give_up)
