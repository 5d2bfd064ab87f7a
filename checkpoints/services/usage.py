"""Bytes stored per Project, Run and kind, kept current by every service that stores or deletes an Artifact
(docs/design/checkpoints.md#usage): each calls ``usage_add`` in its own transaction, so the figures change
exactly when the rows do, and no page scans the storage or the artifacts to show them.
"""

from django.db import IntegrityError, transaction
from django.db.models import F

from checkpoints.models import Artifact, Checkpoint, ManifestEntry, StorageUsage

Kind = StorageUsage.Kind


def usage_add(*, project_id: int, run_id: int | None, kind: str, size: int, files: int) -> None:
    """Add ``size`` bytes and ``files`` files (negative: subtract) to the counter of (project, run, kind).

    ``run_id`` None: stored outside any Run (a Code archive, a logged model without a Run). Safe under
    concurrency: an UPDATE with ``F()``; the first write of a counter creates it, and a concurrent creator's
    unique constraint turns the loser into the UPDATE.
    """
    if not size and not files:
        return
    rows = StorageUsage.objects.filter(project_id=project_id, run_id=run_id, kind=kind)
    if rows.update(bytes=F("bytes") + size, files=F("files") + files):
        return
    try:
        with transaction.atomic():
            StorageUsage.objects.create(project_id=project_id, run_id=run_id, kind=kind, bytes=size, files=files)
    except IntegrityError:
        rows.update(bytes=F("bytes") + size, files=F("files") + files)


def artifact_kind(artifact: Artifact) -> str:
    """Which counter ``artifact`` counts in: a checkpoint's file or tar, a logged model's file, a Code archive,
    else a plain artifact of its Run."""
    if ManifestEntry.objects.filter(artifact_id=artifact.pk).exists():
        return Kind.CHECKPOINT_FILES
    if Checkpoint.objects.filter(artifact_id=artifact.pk).exists():
        return Kind.CHECKPOINT_TAR
    if artifact.logged_model_id is not None:
        return Kind.LOGGED_MODEL
    return Kind.CODE if artifact.run_id is None else Kind.ARTIFACT


def usage_run_id(artifact: Artifact) -> int | None:
    """The Run an artifact's bytes count for: its own, or its logged model's Run."""
    if artifact.run_id is not None or artifact.logged_model_id is None:
        return artifact.run_id
    return artifact.logged_model.run_id


def usage_count(artifact: Artifact, *, sign: int = 1, kind: str | None = None, size: int | None = None) -> None:
    """Count ``artifact`` in (``sign`` 1) or out (-1) of its counter; ``kind`` and ``size`` default to its own."""
    usage_add(
        project_id=artifact.project_id,
        run_id=usage_run_id(artifact),
        kind=kind or artifact_kind(artifact),
        size=sign * (artifact.size if size is None else size),
        files=sign,
    )


def usage_move(artifact: Artifact, *, to_kind: str, from_kind: str) -> None:
    """``artifact`` now counts as ``to_kind`` (a stored file joined a checkpoint)."""
    usage_count(artifact, sign=-1, kind=from_kind)
    usage_count(artifact, kind=to_kind)
