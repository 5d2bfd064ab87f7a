"""What the jobs app answers when runs asks about a Run's Job (``runs.hooks``), how a Run token authenticates
(``mado.authentication``) and whether a ``run_job`` message is still awaited (``mado.outbox``): registered here so the
lower apps never import jobs (docs/design/house.md#arrows)."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from rest_framework.exceptions import AuthenticationFailed

from jobs.models import FINAL_STATES, Job, JobStatus, RunToken
from jobs.selectors import job_for_run, resume_refusal
from jobs.services._common import RUN_JOB_TASK
from jobs.services.lifecycle import job_end_with_run, job_fail_undelivered, job_waits_for_message
from mado import authentication, outbox
from runs import hooks


def job_vouches_for_run(sender, *, run_id: int, now, **kwargs) -> bool:
    """True when Run ``run_id``'s Job is running with a worker heartbeat fresher than ``MADO_JOB_HEARTBEAT_TIMEOUT`` s."""
    fresh = now - timedelta(seconds=settings.MADO_JOB_HEARTBEAT_TIMEOUT)
    return Job.objects.filter(run_id=run_id, status=JobStatus.RUNNING, heartbeat_at__gte=fresh).exists()


def run_is_a_jobs(sender, *, run, **kwargs) -> bool:
    """True when ``run`` ran (or runs) as a Job (docs/design/runs.md#resume-modes, #write-rule: then only its writers
    reopen it by id)."""
    return Job.objects.filter(run_id=run.pk).exists()


def job_of_run_ended(sender, *, run, **kwargs) -> bool:
    """True when ``run`` ran as a Job that reached a final state (docs/design/runs.md#data-stages: no data stage after
    that)."""
    return Job.objects.filter(run_id=run.pk, status__in=FINAL_STATES).exists()


def job_follows_ended_run(sender, *, run, **kwargs) -> None:
    """``run`` ended: its Job, when no worker ever claimed it, ends with it (``job_end_with_run``,
    docs/design/worker.md#subprocess)."""
    job_end_with_run(run=run)


def job_on_run_page(sender, *, run, user, **kwargs) -> dict:
    """``{"job": the Job of run or None, "resume_refusal": why user cannot resume it}`` for every Run page tab
    (docs/design/resume.md#who-may-resume)."""
    return {"job": job_for_run(run=run), "resume_refusal": resume_refusal(user=user, run=run, need_checkpoint=False)}


def run_token_lookup(key: str) -> tuple | None:
    """``(user, RunToken)`` for an active Run token ``key``, None for another key; a revoked one is refused (401)."""
    token = RunToken.objects.select_related("user", "run__project").filter(key=key).first()
    if token is None:
        return None
    if token.revoked_at is not None and token.revoked_at <= timezone.now():  # a future time: revoked then
        raise AuthenticationFailed("This run token was revoked: its Job has ended.")
    return token.user, token


def connect() -> None:
    """Connect the receivers above to ``runs.hooks``; called once from ``JobsConfig.ready``."""
    authentication.register_token_lookup(run_token_lookup)
    hooks.run_kept_alive.connect(job_vouches_for_run, dispatch_uid="jobs.job_vouches_for_run")
    hooks.run_ran_as_job.connect(run_is_a_jobs, dispatch_uid="jobs.run_is_a_jobs")
    hooks.run_job_ended.connect(job_of_run_ended, dispatch_uid="jobs.job_of_run_ended")
    hooks.run_ended.connect(job_follows_ended_run, dispatch_uid="jobs.job_follows_ended_run")
    hooks.run_page_context.connect(job_on_run_page, dispatch_uid="jobs.job_on_run_page")
    outbox.register(RUN_JOB_TASK, waiting=job_waits_for_message, give_up=job_fail_undelivered)
