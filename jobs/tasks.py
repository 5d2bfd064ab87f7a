"""Periodic work of the jobs app (beat; docs/design/house.md#tasks). The Job rows are the truth."""

from celery import shared_task


@shared_task(name="jobs.tasks.reap_stale_jobs", ignore_result=True)
def reap_stale_jobs() -> int:
    """Fail running Jobs whose worker stopped sending heartbeats (``services.job_reap_stale``,
    docs/design/worker.md#subprocess).

    Scheduled every 60 s by beat (``mado.periodic``, from ``JobsConfig.ready``);
    returns how many Jobs it ended. Safe to run twice at once: each Job is
    ended under its row lock, once.
    """
    from jobs.services import job_reap_stale

    return job_reap_stale()
