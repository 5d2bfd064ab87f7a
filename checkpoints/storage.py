"""Streaming access to the artifact storage, ``storages["artifacts"]`` (issue 2 part 4; SPEC F1, F5, F12).

Bytes are never held whole in memory: uploads are read in ``CHUNK_SIZE``
pieces, hashed (SHA-256) and counted on the way into the storage; downloads
are iterators of chunks over a byte range. Works with Django's
``FileSystemStorage`` (open + seek) and django-storages' ``S3Storage``
(boto3 ``get_object`` with a ``Range`` header; ``S3File`` would buffer the
whole object). Every blob is written under a fresh unique key, so a blob is
never overwritten and a failed upload never touches stored bytes.
"""

import hashlib
import io
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from django.core.files import File
from django.core.files.storage import storages

CHUNK_SIZE = 1024 * 1024  # bytes read or written at a time (1 MiB)

logger = logging.getLogger(__name__)


def artifact_storage():
    """The configured artifact storage (FileSystemStorage by default, S3Storage with ``MADO_STORAGE=s3``)."""
    return storages["artifacts"]


@dataclass(frozen=True)
class StoredBlob:
    """Bytes written to the storage: their ``key``, ``size`` in bytes and hex ``sha256``."""

    key: str
    size: int
    sha256: str


class HashingReader(io.RawIOBase):
    """A read-once, non-seekable view of ``source`` that hashes and counts what passes through.

    ``source`` is anything with ``read(n)`` (a WSGI input, an ``UploadedFile``,
    a file). ``read(n)`` returns exactly ``n`` bytes unless the source ends:
    S3 multipart uploads need full-size parts.
    """

    def __init__(self, source):
        super().__init__()
        self._source = source
        self._sha256 = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK_SIZE), b""))
        parts, wanted = [], size
        while wanted > 0:
            data = self._source.read(min(wanted, CHUNK_SIZE))
            if not data:
                break
            self._sha256.update(data)
            self.size += len(data)
            wanted -= len(data)
            parts.append(data)
        return b"".join(parts)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    @property
    def sha256(self) -> str:
        return self._sha256.hexdigest()


class _StreamFile(File):
    """A Django ``File`` over a ``HashingReader`` that hands the storage 1 MiB chunks."""

    DEFAULT_CHUNK_SIZE = CHUNK_SIZE


def new_storage_key(prefix: str) -> str:
    """A fresh storage key under ``prefix`` (``runs/<run_id>/<uuid4 hex>``); never reused."""
    return f"{prefix.strip('/')}/{uuid.uuid4().hex}"


def blob_write(*, source, prefix: str) -> StoredBlob:
    """Stream ``source`` into the storage under a new key below ``prefix``; return key, size, sha256.

    Reads ``source`` to its end in ``CHUNK_SIZE`` pieces (constant memory).
    On any error the partial blob is removed and the error re-raised.
    """
    reader = HashingReader(source)
    key = new_storage_key(prefix)
    try:
        key = artifact_storage().save(key, _StreamFile(reader, name=key))
    except BaseException:
        blob_delete_quietly(key)
        raise
    return StoredBlob(key=key, size=reader.size, sha256=reader.sha256)


def blob_digest(*, source) -> StoredBlob:
    """Read ``source`` to its end without storing it; return its size and sha256 (key ``""``)."""
    reader = HashingReader(source)
    while reader.read(CHUNK_SIZE):
        pass
    return StoredBlob(key="", size=reader.size, sha256=reader.sha256)


def blob_delete_quietly(key: str) -> None:
    """Remove the blob ``key``; a missing blob is fine, a storage error is logged (an orphan, not data loss)."""
    if not key:
        return
    try:
        artifact_storage().delete(key)
    except Exception:  # noqa: BLE001 - the row is the truth; an orphaned blob only costs space
        logger.exception("could not delete artifact blob %s", key)


def blob_open_range(*, key: str, start: int, length: int, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """An iterator over ``length`` bytes of blob ``key`` from offset ``start``, in chunks.

    The blob is opened before this returns (a missing blob raises here, not
    mid-response); closing the iterator closes the underlying file or HTTP body.
    """
    storage = artifact_storage()
    if length <= 0:
        return iter(())
    if hasattr(storage, "bucket") and hasattr(storage, "_normalize_name"):
        return _s3_range(storage, key, start, length, chunk_size)
    if hasattr(storage, "path"):
        handle = open(storage.path(key), "rb")  # noqa: SIM115 - closed by the generator
    else:
        handle = storage.open(key, "rb")
    handle.seek(start)
    return _file_chunks(handle, length, chunk_size)


def _file_chunks(handle, length: int, chunk_size: int) -> Iterator[bytes]:
    try:
        remaining = length
        while remaining > 0:
            data = handle.read(min(chunk_size, remaining))
            if not data:
                break
            remaining -= len(data)
            yield data
    finally:
        handle.close()


def _s3_range(storage, key: str, start: int, length: int, chunk_size: int) -> Iterator[bytes]:
    from storages.utils import clean_name

    name = storage._normalize_name(clean_name(key))
    body = storage.bucket.Object(name).get(Range=f"bytes={start}-{start + length - 1}")["Body"]

    def chunks():
        try:
            yield from body.iter_chunks(chunk_size)
        finally:
            body.close()

    return chunks()
