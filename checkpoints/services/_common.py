"""Helpers shared by the checkpoint upload services (row locks, state checks, the pending → complete step)."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from checkpoints.models import Artifact, Checkpoint, CheckpointState, ManifestEntry, StorageUsage
from checkpoints.services.usage import usage_count
from mado import policy
from mado.errors import Conflict, NotFound
from mado_tracking.tarverify import ManifestFile, ManifestMismatch


def mismatch(checkpoint_id: int, exc: ManifestMismatch) -> str:
    return f"Checkpoint {checkpoint_id} {exc.what} mismatch: {exc.detail}"


def require_writer(actor, checkpoint: Checkpoint) -> None:
    """``Forbidden`` unless ``actor`` may write to the checkpoint's Run (docs/design/runs.md#write-rule)."""
    policy.require_run_writer(actor, checkpoint.run)


def require_pending(checkpoint: Checkpoint) -> None:
    if checkpoint.state == CheckpointState.COMPLETE:
        raise Conflict(f"checkpoint {checkpoint.pk} is complete; its tar can no longer change", field="checkpoint")
    if checkpoint.state == CheckpointState.DELETED:
        raise Conflict(f"checkpoint {checkpoint.pk} is deleted", field="checkpoint")


def lock(checkpoint_id: int) -> Checkpoint:
    """The checkpoint's row, locked; ``NotFound`` when it is gone (a newer writer discarded it,
    docs/design/runs.md#one-writer-process)."""
    row = Checkpoint.objects.select_for_update().select_related("run").filter(pk=checkpoint_id).first()
    if row is None:
        raise NotFound(f"checkpoint {checkpoint_id} not found: it was discarded", field="checkpoint")
    return row


def finalize(row: Checkpoint, received: dict, files: list[ManifestFile]) -> Checkpoint:
    """Inside the caller's transaction and row lock: artifact, manifest rows, then pending → complete."""
    try:
        with transaction.atomic():
            artifact = Artifact.objects.create(
                project_id=row.run.project_id,
                run_id=row.run_id,
                path=row.artifact_path,
                size=received["size"],
                sha256=received["sha256"],
                storage_key=received["storage_key"],
            )
    except IntegrityError:
        raise Conflict(f"{row.artifact_path} is already another file of this run", field="checkpoint") from None
    usage_count(artifact, kind=StorageUsage.Kind.CHECKPOINT_TAR)
    ManifestEntry.objects.bulk_create(
        [ManifestEntry(checkpoint_id=row.pk, path=f.path, size=f.size, sha256=f.sha256) for f in files],
        batch_size=1000,
    )
    updated = Checkpoint.objects.filter(pk=row.pk, state=CheckpointState.PENDING).update(
        state=CheckpointState.COMPLETE,
        artifact=artifact,
        file_count=len(files),
        total_bytes=sum(f.size for f in files),
        tar_size=received["size"],
        tar_sha256=received["sha256"],
        received={"size": received["size"], "sha256": received["sha256"]},
        declared=None,
        error="",
        completed_at=timezone.now(),
    )
    if updated != 1:  # the row lock makes this unreachable; refuse rather than complete twice
        raise Conflict(f"checkpoint {row.pk} is no longer pending", field="checkpoint")
    row.refresh_from_db()
    return row
