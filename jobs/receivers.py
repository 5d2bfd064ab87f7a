"""What the jobs app does when a Run ends (``runs.hooks.run_ended``), how a Run token authenticates
(``mado.authentication``) and whether a ``run_job`` message is still awaited (``mado.outbox``): registered here so
the lower apps never import jobs (docs/design/house.md#arrows)."""

from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from jobs.models import RunToken
from jobs.services._common import RUN_JOB_TASK
from jobs.services.lifecycle import job_end_with_run, job_fail_undelivered, job_waits_for_message
from mado import authentication, outbox, tokens
from runs import hooks


def job_follows_ended_run(sender, *, run, **kwargs) -> None:
    """``run`` ended: its Job, when no worker ever claimed it, ends with it (``job_end_with_run``,
    docs/design/worker.md#subprocess)."""
    job_end_with_run(run=run)


def run_token_lookup(key: str) -> tuple | None:
    """``(user, RunToken)`` for an active Run token ``key``, None for another key; a revoked one is refused (401)."""
    token = tokens.row_for_key(RunToken.objects.select_related("user", "run__project"), key)
    if token is None:
        return None
    if token.revoked_at is not None and token.revoked_at <= timezone.now():  # a future time: revoked then
        raise AuthenticationFailed("This run token was revoked: its Job has ended.")
    return token.user, token


def connect() -> None:
    """Connect the receivers above to ``runs.hooks``; called once from ``JobsConfig.ready``."""
    authentication.register_token_lookup(run_token_lookup)
    hooks.run_ended.connect(job_follows_ended_run, dispatch_uid="jobs.job_follows_ended_run")
    outbox.register(RUN_JOB_TASK, waiting=job_waits_for_message, give_up=job_fail_undelivered)
