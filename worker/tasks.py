"""Celery tasks of the worker (docs/design/house.md#tasks). Take ids, never model instances; the row is the truth."""

import logging
import socket
import threading
import time

from celery import shared_task
from celery.exceptions import Reject
from celery.signals import worker_ready
from django.db import DatabaseError, close_old_connections

from mado.errors import InternalError
from worker import shutdown

VERIFY_MAX_RETRIES = 5
RUN_JOB_MAX_RETRIES = 5
FINISH_ATTEMPTS = 5
# A stopping worker may still receive messages while its running Job's code saves: it hands each back after this
# pause (seconds), so an idle pool child does not receive and return the same message in a tight loop.
REJECT_PAUSE_S = 1.0
_ONE_JOB = threading.Lock()

logger = logging.getLogger(__name__)


@shared_task(bind=True, name="worker.tasks.checkpoint_verify", acks_late=True, max_retries=VERIFY_MAX_RETRIES)
def checkpoint_verify(self, checkpoint_id: int) -> str:
    """Verify a checkpoint tar uploaded straight to S3, then mark it complete or record why not
    (docs/design/worker.md#fetch, #verify).

    Dispatched through the outbox by ``checkpoints.services.checkpoint_complete``. Idempotent: a
    checkpoint that is gone, no longer pending or re-uploaded meanwhile is skipped.
    Returns ``"complete"``, ``"mismatch"`` or ``"skipped"``. Storage errors are
    retried with backoff (10 s doubling, at most 300 s); after the last retry the
    checkpoint keeps the error and stays pending.
    """
    from checkpoints import services

    try:
        return services.checkpoint_verify_upload(checkpoint_id=checkpoint_id)
    except InternalError as exc:
        if self.request.retries >= self.max_retries:
            services.checkpoint_record_error(checkpoint_id=checkpoint_id, error=f"verification failed: {exc}")
            raise
        raise self.retry(exc=exc, countdown=min(10 * 2**self.request.retries, 300)) from exc


@shared_task(
    bind=True, name="worker.tasks.run_job", acks_late=True, reject_on_worker_lost=True, max_retries=RUN_JOB_MAX_RETRIES
)
def run_job(self, job_id: int) -> str:
    """Run Job ``job_id`` on this worker: claim → ``worker.execute.execute`` → ``job_finish`` (docs/design/worker.md).

    Sent on commit by ``jobs.services`` to the Job's queue. Returns the Job's
    final status, or ``"skipped"`` when the Job is gone, final, or claimed by
    another delivery (a redelivered message never runs the code twice).
    Only a database error before the claim retries the task (bounded, 10 s
    doubling, at most 300 s); after the claim every fault ends the Job
    through ``job_finish`` (storage unreadable, worker error), never silently.
    A message whose worker was killed is delivered again: before the claim
    the next delivery runs the Job; after it, the delivery is skipped and
    the heartbeat reaper fails the Job ("worker lost"), so no code runs twice.
    A worker that is stopping claims nothing: the message goes back to the
    broker for another worker (``Reject``); a stop during the Job stops the
    code and ends the Job ``preempted`` (docs/design/worker.md#stop). A worker
    process runs one Job at a time (a second message is handed back).
    """
    if not _ONE_JOB.acquire(blocking=False):
        # The solo pool runs a message whose countdown (a restart's backoff) ran out on Celery's timer thread, beside
        # the Job of the main thread: one Job per worker process, so it goes back to the broker.
        time.sleep(REJECT_PAUSE_S)
        raise Reject(f"this worker runs another Job: job {job_id} left for a free worker", requeue=True)
    try:
        with shutdown.job_guard():
            stopping = shutdown.stop_signal()
            if stopping is not None:
                time.sleep(REJECT_PAUSE_S)
                raise Reject(
                    f"the worker is stopping ({stopping.name}): job {job_id} left for another worker", requeue=True
                )
            return _claim_and_run(self, job_id)
    finally:
        _ONE_JOB.release()


def _claim_and_run(task, job_id: int) -> str:
    from jobs.models import FINAL_STATES, Job
    from jobs.services import job_claim
    from worker.execute import Outcome, execute

    try:
        status = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
        if status is None or status in FINAL_STATES:
            return "skipped"
        job = job_claim(job_id=job_id, worker_host=task.request.hostname or socket.gethostname())
    except DatabaseError as exc:
        close_old_connections()
        raise task.retry(exc=exc, countdown=min(10 * 2**task.request.retries, 300)) from exc
    if job is None:
        return "skipped"
    try:
        outcome = execute(job)
    except Exception as exc:  # noqa: BLE001 - ours, not the code's: the Job must still end, saying why
        stopping = shutdown.stop_signal()
        if stopping is not None:  # a cold shutdown (a second SIGINT, SIGQUIT) broke into the Job: no grace was given
            outcome = Outcome(exit_code=None, error=shutdown.cold_stop_reason(stopping), preempted=True)
        else:
            logger.exception("job %s: the worker failed", job_id)
            outcome = Outcome(exit_code=None, error=f"Worker error on {job.worker_host}: {exc}")
    status = _finish(job_id, outcome)
    _sweep_workdirs()
    return status


@worker_ready.connect
def _sweep_on_start(**kwargs) -> None:
    _sweep_workdirs()


def _sweep_workdirs() -> None:
    """Remove work directories of Jobs that ended while a killed worker held them (``worker.janitor``)."""
    from worker.janitor import remove_ended_workdirs

    try:
        remove_ended_workdirs()
    except DatabaseError:
        logger.warning("could not sweep the work directories", exc_info=True)
        close_old_connections()


def _finish(job_id: int, outcome) -> str:
    """``job_finish`` with a few retries: a locked or restarting database must not leave the Job running."""
    from jobs.services import job_finish

    for attempt in range(1, FINISH_ATTEMPTS + 1):
        try:
            return job_finish(
                job_id=job_id,
                exit_code=outcome.exit_code,
                error=outcome.error,
                aborted=outcome.aborted,
                preempted=outcome.preempted,
            ).status
        except DatabaseError:
            if attempt == FINISH_ATTEMPTS:
                raise
            logger.warning("job %s: recording the outcome failed; trying again", job_id, exc_info=True)
            close_old_connections()
            time.sleep(2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover
