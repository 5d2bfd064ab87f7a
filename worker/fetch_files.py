"""Restore a ``layout="files"`` checkpoint (one stored Artifact per file, e.g. from MLflow) into a Job's working
directory (docs/design/checkpoints.md#mlflow-checkpoints; docs/design/worker.md).

The same guarantees as a tar checkpoint, with the same code: each file is
read with ``worker.fetch.stream_resuming`` (a broken read resumes with a
ranged read) and written by ``worker.extract``'s staging directory
(``O_EXCL | O_NOFOLLOW``, real path kept inside, SHA-256 and size checked
against the ManifestEntry while writing); paths are checked with
``mado_tracking.tarformat.check_path``. Only when every file verified is the staging
directory renamed to ``<workdir>/checkpoint`` (files 0o444, directories 0o555).
"""

from collections.abc import Callable, Iterator
from pathlib import Path

from checkpoints.models import Checkpoint, CheckpointState, ManifestEntry
from mado_tracking.extractdir import ExtractionDir, refuse_existing
from mado_tracking.tarverify import ManifestFile
from worker.errors import CheckpointMismatch
from worker.extract import CHECKPOINT_DIR, _check_path
from worker.fetch import BACKOFF_S, READ_ATTEMPTS, RestoredCheckpoint, _Missing, _stored_size, stream_resuming


def restore_checkpoint_files(
    *,
    checkpoint: Checkpoint,
    workdir: Path,
    attempts: int = READ_ATTEMPTS,
    backoff_s: float = BACKOFF_S,
    on_progress: Callable[[], None] | None = None,
) -> RestoredCheckpoint:
    """Fetch every file of ``checkpoint`` into ``<workdir>/checkpoint``, read-only, verified (docs/design/worker.md).

    Raises ``CheckpointMismatch`` (``Checkpoint <id> <what> mismatch: …``;
    nothing left behind) when the checkpoint is not complete, records no
    file, a path is unsafe, an object is missing or its size or SHA-256
    differs from the manifest; ``StorageUnavailable`` when reads keep
    failing; ``FileExistsError`` when ``<workdir>/checkpoint`` exists.
    ``on_progress()`` is called after each chunk (a heartbeat).
    """
    cid = checkpoint.pk

    def fail(what: str, detail: str) -> CheckpointMismatch:
        return CheckpointMismatch(cid, what, detail)

    if checkpoint.state != CheckpointState.COMPLETE:
        raise fail("artifact", f"the checkpoint is {checkpoint.state}, not complete")
    entries = list(ManifestEntry.objects.filter(checkpoint_id=cid).select_related("artifact").order_by("path"))
    if not entries:
        raise fail("manifest", "the checkpoint records no files")
    for entry in entries:  # every path is checked before any byte is fetched
        _check_path(entry.path, fail)
    target = Path(workdir) / CHECKPOINT_DIR
    refuse_existing(target)
    manifest = [ManifestFile(entry.path, entry.size, entry.sha256) for entry in entries]
    with ExtractionDir(Path(workdir), ".checkpoint-", fail) as staging:
        for entry, expected in zip(entries, manifest, strict=True):
            chunks = _verified_chunks(entry, fail, attempts=attempts, backoff_s=backoff_s, on_progress=on_progress)
            try:
                staging.write_file(entry.path, chunks, mode=0o444, expect=expected)
            except _Missing:
                raise fail("artifact", f"object missing: {entry.path!r} is not in the storage") from None
        staging.commit(target, dir_mode=0o555)
    return RestoredCheckpoint(
        checkpoint_dir=target,
        manifest=manifest,
        size=sum(f.size for f in manifest),
        bytes_written=staging.bytes_written,
    )


def _verified_chunks(
    entry: ManifestEntry, fail, *, attempts: int, backoff_s: float, on_progress: Callable[[], None] | None
) -> Iterator[bytes]:
    """The stored bytes of ``entry``'s file; a stored size other than the manifest's is refused before reading."""
    if entry.artifact is None:
        raise fail("artifact", f"{entry.path!r} has no stored file")
    key = entry.artifact.storage_key
    try:
        size = _stored_size(key, attempts=attempts, backoff_s=backoff_s)
    except _Missing:
        raise fail("artifact", f"object missing: {entry.path!r} ({key}) is not in the storage") from None
    if size != entry.size:
        raise fail("size", f"{entry.path!r} is {size} bytes in the storage, {entry.size} in the manifest")
    for chunk in stream_resuming(key=key, size=size, attempts=attempts, backoff_s=backoff_s):
        yield chunk
        if on_progress is not None:
            on_progress()
