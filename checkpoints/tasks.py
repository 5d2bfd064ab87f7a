"""Periodic work of the checkpoints app (beat; docs/design/house.md#tasks): the janitor of abandoned checkpoints."""

from celery import shared_task


@shared_task(name="checkpoints.tasks.end_abandoned_checkpoints", ignore_result=True)
def end_abandoned_checkpoints() -> int:
    """End pending checkpoints nobody will finish (their Run ended, or their upload lease expired);
    docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#subprocess.

    ``checkpoints.services.checkpoint_end_abandoned``: ``error`` with the
    reason, unfinished S3 multipart uploads aborted. Scheduled every
    ``MADO_REAPER_INTERVAL`` s; returns how many it ended.
    """
    from checkpoints.services import checkpoint_end_abandoned

    return checkpoint_end_abandoned()


@shared_task(name="checkpoints.tasks.apply_scheduled_retention", ignore_result=True)
def apply_scheduled_retention() -> int:
    """Apply the retention policies admins scheduled (docs/design/checkpoints.md#retention), each at most once a
    day; ``checkpoints.services.retention.retention_apply_scheduled``. Returns how many it applied."""
    from checkpoints.services.retention import retention_apply_scheduled

    return retention_apply_scheduled()


@shared_task(name="checkpoints.tasks.scrub_checkpoints", ignore_result=True)
def scrub_checkpoints() -> int:
    """Re-verify stored checkpoints at ``MADO_SCRUB_BYTES_PER_HOUR`` (docs/design/checkpoints.md#scrubbing);
    ``checkpoints.services.scrub.checkpoint_scrub_pass``. Returns the bytes read."""
    from checkpoints.services.scrub import checkpoint_scrub_pass

    return checkpoint_scrub_pass().bytes
