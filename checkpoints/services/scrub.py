"""Re-verifying stored checkpoints at rest (docs/design/checkpoints.md#scrubbing).

Each pass earns ``MADO_SCRUB_BYTES_PER_HOUR`` × the hours since the last one, then reads back complete
checkpoints, the least recently verified first, while it has the bytes to: each stored object's size and
SHA-256 are compared with what was recorded when the checkpoint completed. A match sets ``verified_at``; a
difference or a missing object turns the checkpoint ``corrupt`` (``services.integrity``, the one verdict every reader
reaches: it is never offered for resume again; "resume from latest" takes the newest complete one before it). A
storage that cannot be reached changes nothing.
"""

import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from checkpoints.models import Checkpoint, CheckpointState, ScrubState
from checkpoints.services.integrity import checkpoint_mark_corrupt, checkpoint_problem

logger = logging.getLogger(__name__)


@dataclass
class Scrubbed:
    """One pass: ``verified`` and ``corrupt`` checkpoint ids, ``bytes`` read, ``credit`` left (bytes)."""

    verified: list[int]
    corrupt: list[int]
    bytes: int
    credit: float


def checkpoint_scrub_pass(*, now: datetime | None = None, rate: int | None = None) -> Scrubbed:
    """Run one scrub pass; ``rate`` bytes per hour (default ``MADO_SCRUB_BYTES_PER_HOUR``; 0 does nothing).

    The credit a pass earns is capped at one hour's worth, or the size of the next checkpoint when that is
    larger, so a checkpoint bigger than an hour's budget is still read once the credit allows it, and an idle
    period never turns into a burst. Passes serialise on the ``ScrubState`` row lock.
    """
    rate = settings.MADO_SCRUB_BYTES_PER_HOUR if rate is None else rate
    now = now or timezone.now()
    outcome = Scrubbed([], [], 0, 0.0)
    if rate <= 0:
        return outcome
    with transaction.atomic():
        state, _ = ScrubState.objects.select_for_update().get_or_create(pk=1)
        elapsed = (now - state.updated_at).total_seconds() if state.updated_at else settings.MADO_REAPER_INTERVAL
        earned = state.credit + rate * max(elapsed, 0) / 3600
        credit = None
        for checkpoint in _oldest_verified_first():
            size = checkpoint.stored_bytes
            if credit is None:  # the cap: an hour's worth, or the first checkpoint when it is larger
                credit = min(earned, max(rate, size))
            if size > credit:
                break
            credit -= size
            outcome.bytes += size
            reason = _check(checkpoint)
            if reason is None:
                continue  # the storage could not be reached: try again next pass
            if reason:
                checkpoint_mark_corrupt(checkpoint, reason)
                outcome.corrupt.append(checkpoint.pk)
            else:
                Checkpoint.objects.filter(pk=checkpoint.pk, state=CheckpointState.COMPLETE).update(verified_at=now)
                outcome.verified.append(checkpoint.pk)
        else:
            credit = min(earned if credit is None else credit, rate)
        ScrubState.objects.filter(pk=state.pk).update(credit=credit, updated_at=now)
    outcome.credit = credit
    return outcome


def _oldest_verified_first():
    """Complete checkpoints, never verified first (oldest completion first), then by when last verified."""
    rows = Checkpoint.objects.filter(state=CheckpointState.COMPLETE)
    return rows.order_by(F("verified_at").asc(nulls_first=True), "completed_at", "pk").iterator(chunk_size=100)


def _check(checkpoint: Checkpoint) -> str | None:
    """``""`` when every stored object matches, the reason when one does not, None when the storage failed."""
    try:
        return checkpoint_problem(checkpoint)
    except Exception:  # noqa: BLE001 - an outage is not corruption; the next pass tries again
        logger.warning("scrub of checkpoint %s could not read its stored objects", checkpoint.pk, exc_info=True)
        return None
