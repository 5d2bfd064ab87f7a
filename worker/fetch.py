"""Fetch stored artifacts into a Job's working directory, checking them while the bytes stream (docs/design/worker.md).

A checkpoint tar is downloaded, verified and extracted in one pass
(``restore_checkpoint``): the bytes are read from the artifact storage in
1 MiB chunks (S3: ranged GETs, several at once) and go through the one
restore ``mado agent`` runs too (``mado_tracking.extract.extract_checkpoint_stream``:
the one tar reader, every file's and the tar's SHA-256 on their own threads,
each file's bytes written where they belong); the tar itself is never
stored. Other artifacts (a Code archive) are written to a file with their
SHA-256 checked in the same pass. A read that breaks (connection
reset, S3 error, a body that ends early) resumes with a ranged read from the
first byte not yet received, with backoff, at most ``READ_ATTEMPTS``
consecutive failures in a row. A checkpoint whose stored bytes differ from
its record raises ``CheckpointMismatch`` (``Checkpoint <id> <what> mismatch:
<detail>``); a storage that stays unreadable raises ``StorageUnavailable``.
"""

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, CheckpointState, ManifestEntry
from mado_tracking.extract import extract_checkpoint_stream
from mado_tracking.extractdir import refuse_existing
from mado_tracking.tarverify import ManifestFile, ManifestMismatch
from worker.errors import ArchiveRejected, CheckpointMismatch, StorageUnavailable
from worker.extract import CHECKPOINT_DIR

CHUNK_SIZE = storage.CHUNK_SIZE  # 1 MiB
READ_ATTEMPTS = 5  # consecutive failed reads of one object before giving up
BACKOFF_S = 0.5  # first pause after a failed read; doubles, capped at BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0
OVERSIZE_SLACK = 1024 * 1024  # bytes a stored tar may exceed its record by and still be read to name the difference

logger = logging.getLogger(__name__)


class _Missing(Exception):
    """The storage has no object under the key."""


@dataclass(frozen=True)
class RestoredCheckpoint:
    """The verified directory, the checkpoint's files (by path), ``size`` (bytes read) and ``bytes_written``."""

    checkpoint_dir: Path
    manifest: list[ManifestFile]
    size: int
    bytes_written: int


def manifest_files(checkpoint: Checkpoint) -> list[ManifestFile]:
    """The checkpoint's manifest (``ManifestEntry`` rows) as ``ManifestFile`` values, by path."""
    rows = (
        ManifestEntry.objects.filter(checkpoint_id=checkpoint.pk).order_by("path").values_list("path", "size", "sha256")
    )
    return [ManifestFile(path, size, sha256) for path, size, sha256 in rows]


def restore_checkpoint(
    *,
    checkpoint: Checkpoint,
    workdir: Path,
    attempts: int = READ_ATTEMPTS,
    backoff_s: float = BACKOFF_S,
    on_progress: Callable[[], None] | None = None,
) -> RestoredCheckpoint:
    """Download, verify and extract ``checkpoint``'s tar into ``<workdir>/checkpoint`` in one pass
    (docs/design/worker.md).

    The stored bytes stream (a broken read resumes with a ranged read from
    the first byte not yet verified; S3 in ranged GETs, several at once)
    through the one restore ``mado agent`` runs too
    (``mado_tracking.extract.extract_checkpoint_stream``, hashing on several
    threads, docs/design/checkpoints.md#hash-threads): the
    format's rules (docs/checkpoint-format.md), every member against the
    manifest (extra, missing, size, SHA-256), then the whole tar against the
    recorded size and SHA-256. Each file's bytes are written into a staging
    directory as they are checked; the tar is never stored. Only when all
    passed is the staging directory renamed to ``<workdir>/checkpoint``
    (files 0o444, directories 0o555). Raises ``CheckpointMismatch``
    (``Checkpoint <id> <what> mismatch: …``, nothing left behind) when the
    checkpoint is not complete, its object is missing or any byte differs;
    ``StorageUnavailable`` when reads keep failing; ``FileExistsError`` when
    ``<workdir>/checkpoint`` exists. ``on_progress()`` is called after each
    chunk (a heartbeat; what it raises stops the restore).
    """
    cid = checkpoint.pk

    def fail(what: str, detail: str) -> CheckpointMismatch:
        return CheckpointMismatch(cid, what, detail)

    artifact = checkpoint.artifact
    if checkpoint.state != CheckpointState.COMPLETE or artifact is None or checkpoint.tar_size is None:
        raise fail("artifact", f"the checkpoint is {checkpoint.state} and has no verified tar")
    manifest = manifest_files(checkpoint)
    if not manifest:
        raise fail("manifest", "the checkpoint records no files")
    target = Path(workdir) / CHECKPOINT_DIR
    refuse_existing(target)
    key, recorded = artifact.storage_key, checkpoint.tar_size
    found: dict[str, int] = {}
    chunks = _stored_chunks(key, recorded=recorded, attempts=attempts, backoff_s=backoff_s, on_progress=on_progress)
    try:
        extract_checkpoint_stream(
            chunks,
            target,
            checkpoint_id=cid,
            manifest=manifest,
            tar_size=None,
            tar_sha256=None,
            limits=settings.MADO_TAR_LIMITS,
            threads=settings.MADO_HASH_THREADS,
            fail=fail,
            check=lambda verifier, written: _compare_recorded(checkpoint, verifier, written, found),
        )
    except _Missing:
        raise fail("artifact", f"object missing: {key} is not in the storage") from None
    return RestoredCheckpoint(
        checkpoint_dir=target, manifest=manifest, size=found["size"], bytes_written=found["bytes_written"]
    )


def _stored_chunks(
    key: str, *, recorded: int, attempts: int, backoff_s: float, on_progress: Callable[[], None] | None
) -> Iterator[bytes]:
    """The stored tar's bytes in order (a broken read resumed); refused unread when far longer than recorded."""
    size = _stored_size(key, attempts=attempts, backoff_s=backoff_s)
    if size > recorded + OVERSIZE_SLACK:
        raise ManifestMismatch("size", f"the stored tar is {size} bytes, {recorded} were recorded")
    for chunk in stream_resuming(key=key, size=size, attempts=attempts, backoff_s=backoff_s):
        yield chunk
        if on_progress is not None:
            on_progress()


def _compare_recorded(checkpoint: Checkpoint, verifier, bytes_written: int, found: dict) -> None:
    """The whole tar against the checkpoint's record, after every member matched (so a tampered tar names the
    member that differs); ``found`` gets ``size`` and ``bytes_written``."""
    if verifier.size != checkpoint.tar_size:
        raise ManifestMismatch("size", f"the stored tar is {verifier.size} bytes, {checkpoint.tar_size} were recorded")
    if verifier.sha256 != checkpoint.tar_sha256:
        raise ManifestMismatch(
            "sha256", f"the stored tar's SHA-256 is {verifier.sha256}, {checkpoint.tar_sha256} was recorded"
        )
    found.update(size=verifier.size, bytes_written=bytes_written)


def fetch_artifact(
    *,
    artifact: Artifact,
    dest: Path,
    label: str,
    attempts: int = READ_ATTEMPTS,
    backoff_s: float = BACKOFF_S,
    on_progress: Callable[[], None] | None = None,
) -> None:
    """Download ``artifact`` to ``dest`` (a new file), checking its recorded size and SHA-256 on the way.

    ``label`` names it in errors (``"Code version 3 archive"``). Raises
    ``ArchiveRejected`` (``dest`` removed) when the object is missing or its
    bytes differ; ``StorageUnavailable`` when reads keep failing.
    ``on_progress()`` is called after each chunk.
    """
    digest, count = hashlib.sha256(), 0

    def take(chunk: bytes) -> None:
        nonlocal count
        count += len(chunk)
        if count > artifact.size:
            raise ArchiveRejected(f"{label} size mismatch: the stored object is longer than {artifact.size} bytes")
        digest.update(chunk)

    refuse_existing(dest)
    try:
        size = _stored_size(artifact.storage_key, attempts=attempts, backoff_s=backoff_s)
        _download(
            artifact.storage_key, size, dest, take, attempts=attempts, backoff_s=backoff_s, on_progress=on_progress
        )
        if count != artifact.size:
            raise ArchiveRejected(
                f"{label} size mismatch: the stored object is {count} bytes, {artifact.size} recorded"
            )
        if digest.hexdigest() != artifact.sha256:
            raise ArchiveRejected(
                f"{label} sha256 mismatch: the stored object's SHA-256 is {digest.hexdigest()}, "
                f"{artifact.sha256} recorded"
            )
    except _Missing:
        _unlink(dest)
        raise ArchiveRejected(f"{label} is missing from the storage ({artifact.storage_key})") from None
    except BaseException:
        _unlink(dest)
        raise


def _stored_size(key: str, *, attempts: int, backoff_s: float) -> int:
    """The stored object's current size: a truncated or replaced object is checked for what it is, not retried."""
    return _retrying(lambda: storage.blob_size(key), key, attempts=attempts, backoff_s=backoff_s)


def _download(
    key: str,
    size: int,
    dest: Path,
    on_chunk: Callable[[bytes], None],
    *,
    attempts: int,
    backoff_s: float,
    on_progress: Callable[[], None] | None = None,
) -> None:
    """Write the ``size`` bytes of stored object ``key`` to ``dest`` (created, never overwritten), handing each
    chunk to ``on_chunk`` before it is written."""
    with open(dest, "xb") as out:
        for chunk in stream_resuming(key=key, size=size, attempts=attempts, backoff_s=backoff_s):
            on_chunk(chunk)
            out.write(chunk)
            if on_progress is not None:
                on_progress()


def stream_resuming(
    *, key: str, size: int, attempts: int = READ_ATTEMPTS, backoff_s: float = BACKOFF_S, chunk_size: int = CHUNK_SIZE
) -> Iterator[bytes]:
    """Yield the ``size`` bytes of stored object ``key`` in order, resuming a broken read with a ranged read.

    Each resume opens ``key`` again from the first byte not yet yielded
    (HTTP Range / S3 ranged GET); the pause between tries doubles from
    ``backoff_s``. Raises ``_Missing`` when the object is gone and
    ``StorageUnavailable`` after ``attempts`` consecutive failures.
    """
    offset, failures = 0, 0
    while offset < size:
        chunks = None
        try:
            chunks = storage.blob_open_range(key=key, start=offset, length=size - offset, chunk_size=chunk_size)
            for data in chunks:
                data = data[: size - offset]
                offset += len(data)
                failures = 0
                yield data
            if offset < size:
                raise OSError(f"the read ended after {offset} of {size} bytes")
        except _transient_errors() as exc:
            if storage.is_missing(exc):
                raise _Missing(key) from exc
            failures += 1
            if failures >= attempts:
                raise StorageUnavailable(f"reading {key} failed {failures} times at byte {offset}: {exc}") from exc
            logger.warning(
                "reading %s broke at byte %d of %d (%s); resuming with a ranged read", key, offset, size, exc
            )
            time.sleep(min(backoff_s * 2 ** (failures - 1), BACKOFF_MAX_S))
        finally:
            closer = getattr(chunks, "close", None)
            if closer is not None:
                closer()


def _retrying(call, key: str, *, attempts: int, backoff_s: float):
    for failures in range(1, attempts + 1):
        try:
            return call()
        except _transient_errors() as exc:
            if storage.is_missing(exc):
                raise _Missing(key) from exc
            if failures >= attempts:
                raise StorageUnavailable(f"reading {key} failed {failures} times: {exc}") from exc
            logger.warning("reading %s failed (%s); trying again", key, exc)
            time.sleep(min(backoff_s * 2 ** (failures - 1), BACKOFF_MAX_S))
    raise AssertionError("unreachable")  # pragma: no cover


def _transient_errors() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return (OSError,)
    return (OSError, BotoCoreError, ClientError)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
