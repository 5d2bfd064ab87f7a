"""What happens to a Job while it runs: claim, heartbeat, log, finish, abort, reap, token
(docs/design/worker.md#subprocess).

The worker (``worker/tasks.py``) calls ``job_claim`` → ``run_token_issue`` →
``job_heartbeat`` / ``job_append_log`` while the code runs → ``job_finish``;
users call ``job_abort``; beat calls ``job_reap_stale`` every minute; a Job
no worker claimed ends with its Run (``job_end_with_run``). Each
status change is a conditional UPDATE (or runs under the Job's row lock), so
a worker, a reaper and an abort racing on one Job leave one consistent end
state: the first to finish it wins, the others see a final Job and stop.
"""

import hmac
import importlib
import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from jobs.models import FINAL_STATES, Job, JobStatus, RunLogChunk, RunToken
from jobs.services._common import end_run, record_job_alive, record_job_ended, revoke_on_commit, revoke_run_tokens
from mado import policy, tokens
from mado.audit import audit_record
from mado.errors import Conflict, Forbidden, NotFound, UserError
from runs import hooks
from runs.models import Run, RunStatus

logger = logging.getLogger("jobs")

PREEMPTED_RUN_STATES = (RunStatus.PREEMPTING, RunStatus.PREEMPTED)
TRUNCATED_LINE = "[log truncated]\n"


def _job_or_404(job_id: int, *, lock: bool = False) -> Job:
    jobs = Job.objects.select_for_update() if lock else Job.objects
    job = jobs.filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"job {job_id} not found", field="job")
    return job


def job_claim(*, job_id: int, worker_host: str) -> Job | None:
    """Move Job ``job_id`` from queued to running for ``worker_host``; the Job, or None when it must not run
    (docs/design/worker.md#subprocess).

    One conditional UPDATE (queued → running, setting ``started_at``,
    ``heartbeat_at`` and ``worker_host``): None when another worker won, the
    Job was aborted, already ran (a redelivered message) or does not exist.
    The Run stays ``pending`` until the code's SDK attaches to it
    (``POST runs/`` with its external id).
    """
    now = timezone.now()
    claimed = Job.objects.filter(pk=job_id, status=JobStatus.QUEUED, abort_requested_at__isnull=True).update(
        status=JobStatus.RUNNING, started_at=now, heartbeat_at=now, worker_host=(worker_host or "")[:255]
    )
    if not claimed:
        return None
    record_job_alive(run_id=Job.objects.values_list("run_id", flat=True).get(pk=job_id), now=now)
    return Job.objects.select_related(
        "run__project",
        "run__source_checkpoint__run",
        "code_version__code",
        "code_version__archive",
        "queue",
        "created_by",
    ).get(pk=job_id)


def job_heartbeat(*, job_id: int) -> bool:
    """Record that the worker still runs Job ``job_id``; False means "stop the code now"
    (docs/design/worker.md#subprocess).

    False when an abort was requested, or when the Job is no longer running
    (gone, ended, or failed by the reaper after a missed heartbeat). The
    heartbeat is refreshed even while an abort is pending, so the reaper
    leaves the worker its kill grace period. Call it well within
    ``MADO_JOB_HEARTBEAT_TIMEOUT`` (e.g. every 15 s).
    """
    now = timezone.now()
    if not Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).update(heartbeat_at=now):
        return False
    record_job_alive(run_id=Job.objects.values_list("run_id", flat=True).get(pk=job_id), now=now)
    return not Job.objects.filter(pk=job_id, abort_requested_at__isnull=False).exists()


def _fit(text: str, room: int) -> str:
    """``text`` cut to at most ``room`` UTF-8 bytes, at a character boundary."""
    return text.encode("utf-8")[: max(room, 0)].decode("utf-8", "ignore")


@transaction.atomic
def job_append_log(*, job_id: int, text: str) -> RunLogChunk | None:
    """Append ``text`` (the code's stdout+stderr, any size) to the log of Job ``job_id``'s Run as the next chunk
    (docs/design/worker.md#subprocess).

    Chunks are numbered 1, 2, … per Run (``seq``; unique). The log is capped
    at ``MADO_JOB_LOG_MAX_BYTES`` UTF-8 bytes: the chunk that crosses the cap
    is cut and followed by one ``[log truncated]`` line, and later text is
    dropped (returns None). NUL characters, which PostgreSQL text cannot hold,
    become U+FFFD. ``NotFound`` for an unknown Job.
    """
    if not text:
        return None
    job = _job_or_404(job_id, lock=True)
    if job.log_truncated:
        return None
    text = text.replace("\x00", "\ufffd")
    size = len(text.encode("utf-8"))
    cap = settings.MADO_JOB_LOG_MAX_BYTES
    truncated = job.log_bytes + size > cap
    if truncated:
        text = _fit(text, cap - job.log_bytes)
        size = len(text.encode("utf-8"))
        text += ("" if not text or text.endswith("\n") else "\n") + TRUNCATED_LINE
    seq = (RunLogChunk.objects.filter(run_id=job.run_id).aggregate(n=Max("seq"))["n"] or 0) + 1
    chunk = RunLogChunk.objects.create(run_id=job.run_id, seq=seq, text=text)
    Job.objects.filter(pk=job.pk).update(log_bytes=F("log_bytes") + size, log_truncated=truncated)
    return chunk


def _lock_run_of(job_id: int) -> None:
    """Lock Job ``job_id``'s Run row before the Job's: every path that ends a Job or its Run takes Run, then Job
    (``run_set_status`` and the crash reaper hold the Run when ``job_end_with_run`` locks the Job)."""
    run_id = Job.objects.filter(pk=job_id).values_list("run_id", flat=True).first()
    if run_id is not None:
        Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True).first()


def _outcome(job: Job, exit_code: int | None, error: str, aborted: bool, preempted: bool) -> str:
    """docs/design/worker.md#subprocess, docs/design/runs.md#states: an abort wins over a preemption (its stop
    signal is what the code saw); a clean exit succeeds unless the worker stopped the code before its Run finished;
    a code that marked its Run preempting and then failed was preempted."""
    run_status = Run.objects.filter(pk=job.run_id).values_list("status", flat=True).first()
    stopped = preempted or run_status in PREEMPTED_RUN_STATES
    if aborted or (job.abort_requested_at is not None and (exit_code != 0 or stopped)):
        return JobStatus.ABORTED
    if exit_code == 0 and not error:
        return JobStatus.PREEMPTED if preempted and run_status != RunStatus.FINISHED else JobStatus.SUCCEEDED
    return JobStatus.PREEMPTED if stopped else JobStatus.FAILED


def _default_error(status: str, exit_code: int | None) -> str:
    if status == JobStatus.ABORTED:
        return "Aborted on request."
    if status == JobStatus.PREEMPTED:
        code = f", exiting with code {exit_code}" if exit_code is not None else ""
        return f"Preempted: the code said it was being stopped (run.mark_preempting()){code}."
    return f"The code exited with code {exit_code}." if exit_code is not None else "The Job failed."


def _finish(
    *, job_id: int, exit_code: int | None, error: str, aborted: bool, preempted: bool = False, stale_before=None
) -> tuple[Job, bool]:
    """End the Job under its row lock; ``(job, ended_now)``. With ``stale_before``, only a running Job whose
    heartbeat is older than that (the reaper's guard against a heartbeat that arrived meanwhile): its worker is
    lost, which restarts it like a preemption."""
    with transaction.atomic():
        _lock_run_of(job_id)
        job = _job_or_404(job_id, lock=True)
        if job.status in FINAL_STATES:
            return job, False
        if stale_before is not None and (
            job.status != JobStatus.RUNNING or (job.heartbeat_at and job.heartbeat_at >= stale_before)
        ):
            return job, False
        status = _outcome(job, exit_code, error, aborted, preempted)
        if status != JobStatus.SUCCEEDED and not error:
            error = _default_error(status, exit_code)
        now = timezone.now()
        updated = Job.objects.filter(pk=job.pk, status=job.status).update(
            status=status, exit_code=exit_code, error=error, ended_at=now
        )
        if updated != 1:  # unreachable under the row lock; never end a Job twice
            raise Conflict(f"job {job.pk} changed while it was being finished", field="job")
        end_run(run_id=job.run_id, job_status=status, now=now)
        revoke_run_tokens(run_id=job.run_id, now=now)
        job.refresh_from_db()
        lost_worker = stale_before is not None and status == JobStatus.FAILED
        restarted = (status == JobStatus.PREEMPTED or lost_worker) and job.restarts < job.max_restarts
        restarted = restarted and _quietly(job, "restarted", "jobs.services.restart", "job_restart")
        if not restarted and status == JobStatus.FAILED and job.attempt <= job.max_retries:
            _quietly(job, "retried", "jobs.services.launch", "job_retry_from_scratch")
    return job, True


def _quietly(job: Job, done: str, module: str, name: str) -> bool:
    """Make the automatic next Job of ``job`` (``module.name(job=job)``); False when refused: the end stands and
    its error says why."""
    follow_up = getattr(importlib.import_module(module), name)  # imported late: they import this module
    try:
        with transaction.atomic():
            follow_up(job=job)
    except UserError as exc:  # e.g. the queue was disabled meanwhile: the end stands, say why
        logger.warning("job %s not %s: %s", job.pk, done, exc)
        Job.objects.filter(pk=job.pk).update(error=f"{job.error}\nNot {done}: {exc.detail}".strip())
        job.refresh_from_db()
        return False
    return True


def job_finish(
    *, job_id: int, exit_code: int | None, error: str = "", aborted: bool = False, preempted: bool = False
) -> Job:
    """End Job ``job_id`` with the code's outcome and give its Run the matching status
    (docs/design/worker.md#refusal, #subprocess).

    ``succeeded`` (exit code 0, no ``error``) → Run ``finished``; ``aborted``
    (``aborted=True``, or an abort was requested and the exit code is not 0)
    → Run ``aborted``; ``preempted`` (``preempted=True``: the worker was
    stopping and stopped the code, or the code marked its Run preempting) →
    Run ``preempted``, and with restarts left (``restarts < max_restarts``)
    its automatic resume from the latest checkpoint (``jobs.services.restart``,
    docs/design/resume.md#restarts); otherwise ``failed`` → Run ``failed`` (``error``
    defaults to "The code exited with code N."; pass the verification
    refusal message (docs/design/worker.md#refusal) when the code never started, ``exit_code`` None). The
    Run's ``ended_at`` is set, its tokens revoked. A failed Job with attempts
    left (``attempt <= max_retries``) gets its retry from scratch in the same
    transaction (``job_retry_from_scratch``, docs/design/resume.md#retry). Idempotent: a Job already
    final (e.g. failed by the reaper) is returned unchanged. ``NotFound`` for
    an unknown Job.
    """
    return _finish(job_id=job_id, exit_code=exit_code, error=error or "", aborted=aborted, preempted=preempted)[0]


@transaction.atomic
def job_abort(*, actor, job: Job) -> Job:
    """Abort ``job`` (docs/design/worker.md#subprocess): the Run's creator or a Project admin (else ``Forbidden``), like
    resume.

    Records ``abort_requested_at`` and revokes the Celery task on commit. A
    queued Job ends ``aborted`` at once (its Run too; a worker that receives
    the message anyway cannot claim it). A running Job is stopped by its
    worker: ``job_heartbeat`` answers False, the worker sends SIGTERM to the
    code's process group (SIGKILL after ``MADO_JOB_KILL_GRACE`` s) and calls
    ``job_finish(aborted=True)``. Aborting an aborted Job returns it;
    another final state → ``Conflict``.
    """
    reason = policy.why_cannot_manage_job(actor, job.run)
    if reason:
        raise Forbidden(reason, field="job")
    _lock_run_of(job.pk)
    row = _job_or_404(job.pk, lock=True)
    if row.status == JobStatus.ABORTED:
        return row
    if row.status in FINAL_STATES:
        raise Conflict(
            _("job %(id)s already ended %(status)s; there is nothing to abort") % {"id": row.pk, "status": row.status},
            field="job",
        )
    now = timezone.now()
    if Job.objects.filter(pk=row.pk, abort_requested_at__isnull=True).update(abort_requested_at=now):
        changes = {"abort_requested_at": [None, now.isoformat()]}
        audit_record(actor=actor, action="job.abort", obj=row, project_id=job.run.project_id, changes=changes)
    if Job.objects.filter(pk=row.pk, status=JobStatus.QUEUED).update(
        status=JobStatus.ABORTED, ended_at=now, error=f"Aborted by {actor.get_username()} before it started."
    ):
        end_run(run_id=row.run_id, job_status=JobStatus.ABORTED, now=now)
        revoke_run_tokens(run_id=row.run_id, now=now)
    revoke_on_commit(row.celery_task_id)
    row.refresh_from_db()
    return row


# The other nodes of a JobSet may still send their last points after rank 0 ended the Run, and a finish retried
# after a lost answer must get the same answer: the Run's token stops working this many seconds later.
ENDED_RUN_TOKEN_GRACE_S = 120
_JOB_STATUS_OF_ENDED_RUN = {
    RunStatus.FINISHED: JobStatus.SUCCEEDED,
    RunStatus.ABORTED: JobStatus.ABORTED,
    RunStatus.PREEMPTED: JobStatus.PREEMPTED,
}


def job_end_with_run(*, run: Run) -> Job | None:
    """End ``run``'s Job when it is still ``queued`` although ``run`` has ended; the Job, or None
    (docs/design/worker.md#subprocess).

    A Job that no Celery worker claimed but whose Run ended ran outside a
    worker: in a Kubernetes JobSet (``manage.py job_manifest``, docs/deploy.md)
    the code writes the Run with the Run's token and nothing watches the pods,
    so the Job would otherwise stay ``queued`` for ever. When the Run ends (the
    code's ``run.finish()`` or failure, the crash reaper after the pods fell
    silent) the Job follows: ``succeeded`` for a ``finished`` Run, ``aborted``
    for an aborted one, else ``failed`` naming the Run's status (no automatic
    retry: a failed attempt is resumed by hand, docs/design/resume.md#retry). The Run's tokens stop
    working ``ENDED_RUN_TOKEN_GRACE_S`` seconds later (the other nodes' last
    writes) and the Job's Celery message is revoked. Called from the
    ``runs.hooks.run_ended`` receiver inside the transaction that ended the
    Run; a claimed Job is left to its worker, an ended one as it is.
    """
    job = Job.objects.select_for_update().filter(run_id=run.pk, status=JobStatus.QUEUED).first()
    if job is None:
        return None
    status = _JOB_STATUS_OF_ENDED_RUN.get(run.status, JobStatus.FAILED)
    error = (
        ""
        if status == JobStatus.SUCCEEDED
        else (f"Its Run ended {run.status} without a worker (the code ran elsewhere, e.g. in a Kubernetes JobSet).")
    )
    now = timezone.now()
    Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).update(
        status=status, error=error, started_at=run.started_at, ended_at=now
    )
    record_job_ended(run_id=run.pk)
    revoke_run_tokens(run_id=run.pk, now=now + timedelta(seconds=ENDED_RUN_TOKEN_GRACE_S))
    revoke_on_commit(job.celery_task_id)
    job.refresh_from_db()
    return job


def job_reap_stale(*, now=None) -> int:
    """Fail every running Job whose heartbeat is older than ``MADO_JOB_HEARTBEAT_TIMEOUT`` s; how many
    (docs/design/worker.md#subprocess).

    The worker vanished (host lost, SIGKILL, OOM): such a Job ends
    ``failed`` with "Worker lost: …" (``aborted`` when an abort was pending)
    and its Run likewise, through ``job_finish``'s rules (including an
    automatic retry). A heartbeat that arrives between the scan and the
    row lock spares the Job. ``now`` is for tests. Called by beat every 60 s
    (``jobs.tasks.reap_stale_jobs``).
    """
    now = now or timezone.now()
    timeout = settings.MADO_JOB_HEARTBEAT_TIMEOUT
    cutoff = now - timedelta(seconds=timeout)
    stale = Job.objects.filter(status=JobStatus.RUNNING).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    )
    reaped = 0
    for job_id, host, beat, abort in stale.values_list("pk", "worker_host", "heartbeat_at", "abort_requested_at"):
        since = beat.isoformat(timespec="seconds") if beat else "its start"
        error = (
            f"Worker lost: no heartbeat from {host or 'the worker'} since {since} "
            f"(MADO_JOB_HEARTBEAT_TIMEOUT={timeout} s)."
        )
        _, ended = _finish(job_id=job_id, exit_code=None, error=error, aborted=abort is not None, stale_before=cutoff)
        if ended:
            logger.warning("job %s reaped: %s", job_id, error)
            reaped += 1
    return reaped


def job_waits_for_message(args: list) -> bool:
    """True while the Job ``args[0]`` of a ``run_job`` message is still ``queued`` and its Run ``pending`` (the
    outbox's hook, docs/design/worker.md#subprocess): once code running elsewhere (a Kubernetes JobSet) attached the
    Run, nothing waits."""
    return Job.objects.filter(pk=args[0], status=JobStatus.QUEUED, run__status=RunStatus.PENDING).exists()


def job_fail_undelivered(args: list, reason: str) -> None:
    """Fail the still-queued Job ``args[0]``: no worker took its message (the outbox gave up; ``reason`` says why).

    Ends it through ``job_finish`` (its Run ``failed``, a retry from scratch
    when attempts are left, docs/design/resume.md#retry). A Job claimed or ended meanwhile, or whose Run code running
    elsewhere attached, is left as is. After the commit ``runs.hooks.job_given_up`` tells the higher apps.
    """
    with transaction.atomic():
        _lock_run_of(args[0])
        if (
            Job.objects.select_for_update()
            .filter(pk=args[0], status=JobStatus.QUEUED, run__status=RunStatus.PENDING)
            .exists()
        ):
            _finish(job_id=args[0], exit_code=None, error=f"The Job never started. {reason}", aborted=False)
            job = Job.objects.select_related("run", "queue").get(pk=args[0])
            transaction.on_commit(lambda: hooks.job_given_up.send(sender=None, job=job, reason=reason), robust=True)


@transaction.atomic
def run_token_issue(*, job: Job) -> RunToken:
    """The API token for ``job``'s code (``MMT_API_TOKEN``): acts as the Job's creator on the Job's Run only.

    Returns the Run's active token with its ``key`` (set on the instance, never
    stored: docs/api.md#tokens), creating it on the first call (one active token
    per Run: row lock + database constraint); a retried worker gets the same key.
    A token whose key cannot be given again (carried over from plain storage, or
    the server's secret key changed) is revoked and replaced. Revoked when the
    Job ends; ``Conflict`` for a Job that already ended.
    """
    row = _job_or_404(job.pk, lock=True)
    if row.status in FINAL_STATES:
        raise Conflict(f"job {row.pk} already ended {row.status}: no token is issued", field="job")
    token = RunToken.objects.filter(run_id=row.run_id, revoked_at__isnull=True).first()
    if token is not None:
        key = tokens.run_key_for(token.salt)
        if token.salt and hmac.compare_digest(token.digest, tokens.key_digest(key)):
            token.key = key
            return token
        revoke_run_tokens(run_id=row.run_id)
    salt = secrets.token_hex(16)
    key = tokens.run_key_for(salt)
    token = RunToken.objects.create(
        run_id=row.run_id,
        user_id=row.created_by_id,
        salt=salt,
        prefix=tokens.key_prefix(key),
        digest=tokens.key_digest(key),
    )
    token.key = key
    return token
