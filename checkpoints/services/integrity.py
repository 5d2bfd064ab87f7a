"""A stored object checked against its record when it is read, and a damaged checkpoint named once
(docs/design/checkpoints.md#damage).

Every read of a checkpoint's bytes (a download through the API or MLflow, ``mado checkpoint restore``, the worker,
the scrubber) reaches ``stored_object_problem``: the object missing, or of another size or SHA-256 than was verified
when it was stored, is a reason. ``checkpoint_mark_corrupt`` turns each checkpoint holding such an object ``corrupt``
with that reason (a conditional update: one transition, one ``checkpoint_corrupt`` event however many readers found
it at once) and the reader answers 410 ``checkpoint_corrupt`` instead of a 500 or a body cut short.
"""

import logging

from django.db import transaction

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, CheckpointLayout, CheckpointState, ManifestEntry
from mado.errors import UserError
from runs.hooks import checkpoint_corrupt

logger = logging.getLogger(__name__)


class CheckpointCorrupt(UserError):
    """A checkpoint's stored bytes are missing or differ from what was verified: 410 ``checkpoint_corrupt``."""

    status = 410
    code = "checkpoint_corrupt"


class ArtifactDamaged(UserError):
    """A stored file (no checkpoint's) is missing or differs from what was verified: 410 ``artifact_damaged``."""

    status = 410
    code = "artifact_damaged"


READ_ALWAYS, READ_IF_CHANGED, READ_NEVER = "always", "if changed", "never"


def stored_object_problem(artifact: Artifact, *, what: str, read: str = READ_IF_CHANGED) -> str:
    """``""`` when ``artifact``'s stored object matches its record, else the reason, starting with ``what``.

    A stat (or S3 HEAD) first: a missing object or another size is a reason at once. Then the bytes are read and
    hashed (constant memory) per ``read``: ``READ_ALWAYS`` (the scrubber, which looks for damage a stat cannot
    see); ``READ_IF_CHANGED`` unless the stat's fingerprint is the one recorded the last time they were read back
    whole and matched (a rewrite changes it); ``READ_NEVER`` (a ranged read that does not start at the first byte:
    the request for the first byte reads them, so parallel ranged GETs read the object back once, not once each).
    A read that matches records the fingerprint. Raises ``StorageUnreachable`` or the storage's own error for an
    outage (answered 503 by ``mado.outages``): never a reason.
    """
    found = storage.blob_fingerprint(artifact.storage_key)
    if found is None:
        return f"{what}: the stored object is missing"
    if found.size != artifact.size:
        return f"{what}: the stored object is {found.size} bytes, {artifact.size} were verified"
    trusted = found.fingerprint and found.fingerprint == artifact.stored_fingerprint
    if read == READ_NEVER or (read == READ_IF_CHANGED and trusted):
        return ""
    try:
        back = storage.blob_stat(artifact.storage_key, size=found.size)
    except Exception as exc:
        if storage.is_missing(exc):
            storage.check_reachable()
            return f"{what}: the stored object is missing"
        raise
    if back.size != artifact.size:
        return f"{what}: the stored object is {back.size} bytes, {artifact.size} were verified"
    if back.sha256 != artifact.sha256:
        return f"{what}: the stored object's SHA-256 is {back.sha256}, {artifact.sha256} was verified"
    if found.settled and found.fingerprint and found.fingerprint != artifact.stored_fingerprint:
        Artifact.objects.filter(pk=artifact.pk, storage_key=artifact.storage_key).update(
            stored_fingerprint=found.fingerprint
        )
        artifact.stored_fingerprint = found.fingerprint
    return ""


def artifact_check_stored(artifact: Artifact, *, from_first_byte: bool = True) -> None:
    """Before ``artifact``'s bytes are sent: raise ``CheckpointCorrupt`` when it belongs to a checkpoint that is
    ``corrupt`` or becomes so now, ``ArtifactDamaged`` (a file of no checkpoint) when the stored object is missing or
    differs from its record.

    Cheap when nothing changed since the bytes were last read back whole (one stat); the first read from the first
    byte after a rewrite, or ever, hashes the object once before answering; a read from a later byte
    (``from_first_byte`` False) only stats it (docs/design/checkpoints.md#damage).
    """
    holders = _holders(artifact)
    for checkpoint, _what in holders:
        checkpoint_refuse_corrupt(checkpoint)  # a corrupt checkpoint is never downloaded, not even its intact files
    read = READ_IF_CHANGED if from_first_byte else READ_NEVER
    reason = stored_object_problem(artifact, what=holders[0][1] if holders else artifact.path, read=read)
    if not reason:
        return
    for checkpoint, _what in holders:
        checkpoint_mark_corrupt(checkpoint, reason)
    if holders:
        raise CheckpointCorrupt(f"checkpoint {holders[0][0].pk} is corrupt: {reason}", field="checkpoint")
    raise ArtifactDamaged(f"the stored file is damaged: {reason}", field="path")


def checkpoint_refuse_corrupt(checkpoint: Checkpoint) -> None:
    """``CheckpointCorrupt`` naming the reason recorded when ``checkpoint`` turned ``corrupt``; nothing otherwise."""
    if checkpoint.state == CheckpointState.CORRUPT:
        raise CheckpointCorrupt(f"checkpoint {checkpoint.pk} is corrupt: {checkpoint.error}", field="checkpoint")


def checkpoint_problem(checkpoint: Checkpoint) -> str:
    """``""`` when every stored object of ``checkpoint`` (its tar, or each file of a checkpoint stored file by file)
    matches its record, else the first reason (``stored_object_problem``, every byte read). Raises on a storage
    outage."""
    if checkpoint.layout == CheckpointLayout.FILES:
        entries = ManifestEntry.objects.filter(checkpoint=checkpoint).select_related("artifact").order_by("path")
        objects = [(entry.artifact, entry.path) for entry in entries]
    else:
        objects = [(Artifact.objects.filter(pk=checkpoint.artifact_id).first(), "the tar")]
    for artifact, what in objects:
        if artifact is None:
            return f"{what} has no stored object"
        reason = stored_object_problem(artifact, what=what, read=READ_ALWAYS)
        if reason:
            return reason
    return ""


def checkpoint_confirm_damage(checkpoint: Checkpoint) -> str:
    """After a reader (the worker) found ``checkpoint``'s bytes differing from its record: read the stored objects
    back and mark it ``corrupt`` when they do differ; returns the reason or ``""``.

    The reader's own verdict is not enough on its own: a format limit lowered since the upload also refuses a tar
    whose bytes are intact. A storage that cannot be reached changes nothing (logged).
    """
    if checkpoint.state != CheckpointState.COMPLETE:
        return ""
    try:
        reason = checkpoint_problem(checkpoint)
    except Exception:  # noqa: BLE001 - an outage is not damage; the scrubber or the next reader looks again
        logger.warning("could not read checkpoint %s back to confirm damage", checkpoint.pk, exc_info=True)
        return ""
    if reason:
        checkpoint_mark_corrupt(checkpoint, reason)
    return reason


def checkpoint_mark_corrupt(checkpoint: Checkpoint, reason: str) -> bool:
    """complete → ``corrupt`` with ``reason`` in ``error`` (conditional: True for the one call that changed it), and
    ``runs.hooks.checkpoint_corrupt`` after the commit."""
    changed = Checkpoint.objects.filter(pk=checkpoint.pk, state=CheckpointState.COMPLETE).update(
        state=CheckpointState.CORRUPT, error=reason
    )
    if changed:
        checkpoint.state, checkpoint.error = CheckpointState.CORRUPT, reason
        logger.warning("checkpoint %s is corrupt: %s", checkpoint.pk, reason)
        transaction.on_commit(
            lambda: checkpoint_corrupt.send_robust(sender=Checkpoint, checkpoint=checkpoint, reason=reason)
        )
    return bool(changed)


def _holders(artifact: Artifact) -> list[tuple[Checkpoint, str]]:
    """The complete and corrupt checkpoints whose bytes ``artifact`` holds, each with what the object is to it."""
    complete = Checkpoint.objects.filter(state__in=[CheckpointState.COMPLETE, CheckpointState.CORRUPT])
    tars = [(checkpoint, "the tar") for checkpoint in complete.filter(artifact=artifact)]
    files = [
        (entry.checkpoint, entry.path)
        for entry in ManifestEntry.objects.filter(artifact=artifact, checkpoint__in=complete).select_related(
            "checkpoint"
        )
    ]
    return tars + files
