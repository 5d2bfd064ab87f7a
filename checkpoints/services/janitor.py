"""Ending checkpoints nobody will finish (docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#subprocess):
the janitor and the verification's outbox hooks.

A pending checkpoint is abandoned when its upload lease expired
(``MADO_CHECKPOINT_UPLOAD_LEASE`` s after it was registered) or when its Run
ended more than ``MADO_CHECKPOINT_ENDED_GRACE`` s ago while the upload was
unfinished. It ends ``error`` with the reason, and what its upload left in
the storage (an unfinished S3 multipart upload, a stored tar) is removed.
The SDK's next start of the same Run may save that step again
(``checkpoint_register`` replaces an ``error`` checkpoint).
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from checkpoints.models import Checkpoint, CheckpointState
from checkpoints.services.checkpoints import discard_upload
from runs import hooks
from runs.models import FINAL_STATES as RUN_FINAL_STATES

logger = logging.getLogger("checkpoints")


def checkpoint_end_in_error(*, checkpoint_id: int, error: str) -> bool:
    """End pending checkpoint ``checkpoint_id`` ``error`` with ``error`` and discard its upload; False if not pending.

    A reason already recorded on the pending checkpoint (its upload ran out
    of space, was cut off, did not match) stays first, ``error`` follows it
    on a line of its own: the janitor's generic reason never hides what
    happened. Under the row lock, so a concurrent completion or verification either
    wins (then this does nothing) or finds the checkpoint ended. After the commit,
    ``runs.hooks.checkpoint_refused`` tells the higher apps (alerts) the whole reason.
    """
    with transaction.atomic():
        row = Checkpoint.objects.select_for_update().filter(pk=checkpoint_id, state=CheckpointState.PENDING).first()
        if row is None:
            return False
        if row.error.strip() and error not in row.error:
            error = f"{row.error.strip()}\n{error}"
        Checkpoint.objects.filter(pk=row.pk).update(state=CheckpointState.ERROR, error=error[:10_000], declared=None)
        discard_upload(row.received, on_commit=True)
        transaction.on_commit(
            lambda: hooks.checkpoint_refused.send(sender=None, checkpoint=row, reason=error), robust=True
        )
    logger.warning("checkpoint %s ended in error: %s", checkpoint_id, error)
    return True


def checkpoint_end_abandoned(*, now=None) -> int:
    """End every abandoned pending checkpoint ``error`` (module docstring); how many. ``now`` is for tests.

    One awaiting its verification is left to the verification's own
    deadline (the outbox re-sends it, then gives up) unless its lease expired.
    Scheduled by beat every ``MADO_REAPER_INTERVAL`` s (``checkpoints.tasks.end_abandoned_checkpoints``).
    """
    now = now or timezone.now()
    lease = settings.MADO_CHECKPOINT_UPLOAD_LEASE
    lease_cutoff = now - timedelta(seconds=lease)
    expired = Q(created_at__lt=lease_cutoff)
    run_ended = Q(
        run__status__in=RUN_FINAL_STATES,
        run__ended_at__lt=now - timedelta(seconds=settings.MADO_CHECKPOINT_ENDED_GRACE),
    ) & ~Q(received__has_key="uploaded")
    ended = 0
    for checkpoint_id, created_at in (
        Checkpoint.objects.filter(state=CheckpointState.PENDING)
        .filter(expired | run_ended)
        .values_list("pk", "created_at")
    ):
        if created_at < lease_cutoff:
            error = f"The upload was not finished within its lease of {lease} s; save the checkpoint again."
        else:
            error = "The Run ended before the upload was finished; save the checkpoint again."
        ended += checkpoint_end_in_error(checkpoint_id=checkpoint_id, error=error)
    return ended


def verification_waits(args: list) -> bool:
    """True while checkpoint ``args[0]`` is uploaded and waits for its verification (the outbox's hook)."""
    return Checkpoint.objects.filter(pk=args[0], state=CheckpointState.PENDING, received__uploaded=True).exists()


def verification_give_up(args: list, reason: str) -> None:
    """End checkpoint ``args[0]`` ``error``: its verification never ran (the outbox gave up; ``reason`` says why)."""
    checkpoint_end_in_error(checkpoint_id=args[0], error=f"The checkpoint was never verified. {reason}")
