"""Reads of Artifacts for pages and the API (STYLE: Selectors; issue 2 part 4, SPEC F5, F12).

Every lookup is scoped to the user's Projects: another Project's artifact is
indistinguishable from a missing one (``NotFound``, 404).
"""

from collections.abc import Iterator

from django.db.models import QuerySet

from checkpoints import storage
from checkpoints.models import Artifact
from mado.errors import NotFound
from runs.models import Run


def artifact_list(*, run: Run) -> QuerySet[Artifact]:
    """The stored files of ``run`` (the caller has checked visibility), ordered by path."""
    return Artifact.objects.filter(run=run).order_by("path", "id")


def artifact_get_for_user(*, user, run_id, path: str) -> Artifact:
    """The artifact ``path`` of Run ``run_id`` in one of the user's Projects; else ``NotFound`` naming ``path``."""
    try:
        run_id = int(run_id)
    except (TypeError, ValueError):
        raise NotFound(f"run {run_id!r} not found", field="run") from None
    artifact = (
        Artifact.objects.visible_to(user).select_related("project", "run").filter(run_id=run_id, path=path).first()
    )
    if artifact is None:
        raise NotFound(f"artifact {path!r} of run {run_id} not found", field="path")
    return artifact


def artifact_open_range(*, artifact: Artifact, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bytes ``start``..``end`` (inclusive offsets; ``end`` None = to the last byte) of ``artifact``, streamed.

    The caller has checked ``0 <= start <= end < artifact.size``. Returns an
    iterator of chunks of at most 1 MiB; close it to release the file or the
    S3 connection. Used by downloads with HTTP Range (SPEC F12: a broken
    download resumes where it stopped).
    """
    last = artifact.size - 1 if end is None else min(end, artifact.size - 1)
    return storage.blob_open_range(key=artifact.storage_key, start=start, length=last - start + 1)
