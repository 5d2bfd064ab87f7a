"""Celery tasks of the worker (STYLE: Celery tasks). Take ids, never model instances; the row is the truth."""

from mado.celery import app
from mado.errors import InternalError

VERIFY_MAX_RETRIES = 5


@app.task(bind=True, name="worker.tasks.checkpoint_verify", acks_late=True, max_retries=VERIFY_MAX_RETRIES)
def checkpoint_verify(self, checkpoint_id: int) -> str:
    """Verify a checkpoint tar uploaded straight to S3, then mark it complete or record why not (issue 3; SPEC F12, F13).

    Enqueued on commit by ``checkpoints.services.checkpoint_complete``. Idempotent: a
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
