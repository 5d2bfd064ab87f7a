"""Periodic work of the jobs app (beat; STYLE: Celery tasks). The Job rows are the truth."""

from celery import shared_task


@shared_task(name="jobs.tasks.reap_stale_jobs", ignore_result=True)
def reap_stale_jobs() -> int:
    """Fail running Jobs whose worker stopped sending heartbeats (``services.job_reap_stale``, SPEC F16).

    Scheduled every 60 s by ``CELERY_BEAT_SCHEDULE`` (mado/settings.py);
    returns how many Jobs it ended. Safe to run twice at once: each Job is
    ended under its row lock, once.
    """
    from jobs.services import job_reap_stale

    return job_reap_stale()


@shared_task(name="jobs.tasks.reap_crashed_runs", ignore_result=True)
def reap_crashed_runs() -> int:
    """Mark Runs whose SDK heartbeat stopped ``crashed`` (``preempted`` when preempting); SPEC F26.

    Scheduled every 60 s by ``CELERY_BEAT_SCHEDULE``; returns how many Runs it ended
    (``runs.liveness.runs_reap_crashed``).
    """
    from runs.liveness import runs_reap_crashed

    return runs_reap_crashed()


@shared_task(name="jobs.tasks.flush_dispatches", ignore_result=True)
def flush_dispatches() -> int:
    """Send the outbox's messages that the broker refused (it was down); returns how many it took (F16).

    Scheduled every ``MADO_REAPER_INTERVAL`` s (``mado.outbox.dispatch_flush``).
    """
    from mado.outbox import dispatch_flush

    return dispatch_flush()


@shared_task(name="jobs.tasks.reap_undelivered", ignore_result=True)
def reap_undelivered() -> int:
    """Re-send, then give up, messages that no worker took within ``MADO_DISPATCH_TIMEOUT`` s (F16).

    A queued Job is sent once more, then failed "The Job never started…";
    a checkpoint verification likewise ends the checkpoint ``error``
    (``mado.outbox.dispatch_reap_overdue``). Scheduled every ``MADO_REAPER_INTERVAL`` s.
    """
    from mado.outbox import dispatch_reap_overdue

    return dispatch_reap_overdue()


@shared_task(name="jobs.tasks.end_abandoned_checkpoints", ignore_result=True)
def end_abandoned_checkpoints() -> int:
    """End pending checkpoints nobody will finish (their Run ended, or their upload lease expired); F1, F16.

    ``checkpoints.services.checkpoint_end_abandoned``: ``error`` with the
    reason, unfinished S3 multipart uploads aborted. Scheduled every
    ``MADO_REAPER_INTERVAL`` s; returns how many it ended.
    """
    from checkpoints.services import checkpoint_end_abandoned

    return checkpoint_end_abandoned()
