"""Deleting checkpoints, one or many, through the one protection check (docs/design/checkpoints.md#deletion).

Every deletion — a checkpoint's Delete button or API call, a bulk delete from the Runs table, a retention
policy applied by an admin or by beat — locks the Run's checkpoint rows, asks
``selectors.checkpoint_delete_refusal`` (the one list of protections) for each checkpoint under those locks,
and deletes through ``delete_locked``: the row stays ``deleted``, a ``CheckpointDeletion`` records what went,
the usage counters drop, and the stored objects are removed once the transaction commits.
"""

from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from checkpoints import selectors, storage
from checkpoints.models import Artifact, Checkpoint, CheckpointDeletion, CheckpointState, ManifestEntry, StorageUsage
from checkpoints.services.usage import usage_count
from mado import policy
from mado.errors import Conflict


@dataclass
class Deleted:
    """What a bulk deletion did: ``deleted`` (checkpoints now ``deleted``), ``refused`` ({checkpoint id: the
    protection's sentence}), ``bytes`` removed from the storage."""

    deleted: list[Checkpoint] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    bytes: int = 0


def lock_run_checkpoints(run_id: int) -> dict[int, Checkpoint]:
    """Lock every checkpoint row of Run ``run_id`` in id order (the order resume and continue take)."""
    return {row.pk: row for row in Checkpoint.objects.select_for_update().filter(run_id=run_id).order_by("pk")}


def _stored(row: Checkpoint) -> list[tuple[Artifact, str]]:
    """The stored objects ``row`` holds, each with its usage kind: a tar checkpoint's one artifact, or one per
    manifest entry of a checkpoint logged file by file (MLflow, layout "files"), whatever its state."""
    artifact = Artifact.objects.filter(pk=row.artifact_id).first() if row.artifact_id else None
    stored = [(artifact, StorageUsage.Kind.CHECKPOINT_TAR)] if artifact is not None else []
    entries = ManifestEntry.objects.filter(checkpoint=row, artifact__isnull=False).select_related("artifact")
    return stored + [(entry.artifact, StorageUsage.Kind.CHECKPOINT_FILES) for entry in entries]


def delete_locked(*, row: Checkpoint, actor, cause: str) -> tuple[Checkpoint, int]:
    """Delete the locked, unprotected ``row`` (the caller checked ``checkpoint_delete_refusal``): state
    ``deleted``, a ``CheckpointDeletion`` of ``cause`` (``CheckpointDeletion.Cause``) with the bytes its stored
    objects held, usage counted out, stored bytes removed on commit. Returns the row and those bytes (a
    checkpoint that ended ``error`` with files stored frees them too). ``Conflict`` if the row changed under the
    lock (cannot happen; said rather than guessed)."""
    from checkpoints.services.checkpoints import discard_upload  # registration imports this module

    stored = _stored(row)
    freed = sum(item.size for item, _ in stored)
    updated = Checkpoint.objects.filter(pk=row.pk, state=row.state).update(
        state=CheckpointState.DELETED,
        artifact=None,
        received={},
        declared=None,
        deleted_at=timezone.now(),
        deleted_by=actor,
    )
    if updated != 1:
        raise Conflict(f"checkpoint {row.pk} changed while it was being deleted; try again", field="checkpoint")
    CheckpointDeletion.objects.create(
        project_id=row.run.project_id,
        run_id=row.run_id,
        checkpoint_id=row.pk,
        step=row.step,
        bytes=freed,
        cause=cause,
        deleted_by=actor,
    )
    ManifestEntry.objects.filter(checkpoint=row, artifact__isnull=False).update(artifact=None)
    discard_upload(row.received, on_commit=True)
    for item, kind in stored:
        item.delete()
        usage_count(item, sign=-1, kind=kind)
        transaction.on_commit(lambda key=item.storage_key: storage.blob_delete_quietly(key))
    row.refresh_from_db()
    return row, freed


@transaction.atomic
def checkpoints_delete(*, actor, project, checkpoint_ids: list[int], cause: str) -> Deleted:
    """Delete the checkpoints ``checkpoint_ids`` of ``project`` that no protection holds; the others are refused
    with the protection's sentence, never deleted (docs/design/checkpoints.md#deletion, #retention).

    Project admin only (``Forbidden``). Ids of another Project, already deleted or unknown are skipped (a
    retried bulk delete is a no-op). Runs are locked one at a time, each Run's rows in id order, so a resume
    taking one of them as its source either waits for this or is seen by the protection.
    """
    policy.require_role(actor, project, policy.ADMIN)
    outcome = Deleted()
    wanted = Checkpoint.objects.filter(pk__in=checkpoint_ids, run__project=project).exclude(
        state=CheckpointState.DELETED
    )
    for run_id in sorted(set(wanted.values_list("run_id", flat=True))):
        locked = lock_run_checkpoints(run_id)
        kept = selectors.checkpoint_kept_ids(run_id=run_id)
        for pk in sorted(set(checkpoint_ids) & locked.keys()):
            row = locked[pk]
            if row.state == CheckpointState.DELETED:
                continue
            refusal = selectors.checkpoint_delete_refusal(checkpoint=row, kept_ids=kept)
            if refusal:
                outcome.refused[pk] = refusal
                continue
            deleted, freed = delete_locked(row=row, actor=actor, cause=cause)
            outcome.deleted.append(deleted)
            outcome.bytes += freed
    return outcome
