"""Streaming access to the artifact storage, ``storages["artifacts"]``
(docs/design/checkpoints.md#a-checkpoint, #deletion; docs/design/worker.md#fetch).

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
import os
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice

from django.conf import settings
from django.core.files import File
from django.core.files.storage import storages

from mado.outages import StorageUnreachable

CHUNK_SIZE = 1024 * 1024  # bytes read or written at a time (1 MiB)
S3_RANGE_PART = 8 * 1024 * 1024  # bytes of one ranged GET when a long S3 range is read
S3_RANGE_PARALLEL = 4  # ranged GETs in flight at once (and parts held in memory)

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


class StreamReader(io.RawIOBase):
    """A read-once, non-seekable view of ``source`` that counts what passes through and hands it to ``on_chunk``.

    ``source`` is anything with ``read(n)`` (a WSGI input, an ``UploadedFile``,
    a file); it is never asked for more than ``CHUNK_SIZE`` bytes at a time.
    ``read(n)`` returns exactly ``n`` bytes unless the source ends: S3
    multipart uploads need full-size parts. ``on_chunk(data)`` sees every
    piece in order (a hash, a tar verifier); an exception it raises aborts
    the read and with it the storage write.
    """

    def __init__(self, source, on_chunk=None):
        super().__init__()
        self._source = source
        self._on_chunk = on_chunk
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
            if self._on_chunk is not None:
                self._on_chunk(data)
            self.size += len(data)
            wanted -= len(data)
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class HashingReader(StreamReader):
    """A ``StreamReader`` that hashes (SHA-256) what passes through; ``sha256`` is the hex digest so far."""

    def __init__(self, source):
        self._sha256 = hashlib.sha256()
        super().__init__(source, self._sha256.update)

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
    key = _write(reader, prefix)
    return StoredBlob(key=key, size=reader.size, sha256=reader.sha256)


def blob_write_through(*, source, prefix: str, on_chunk) -> tuple[str, int]:
    """Stream ``source`` into a new key below ``prefix``, handing each piece to ``on_chunk``; ``(key, size)``.

    Nothing is hashed here: ``on_chunk`` (a ``CheckpointVerifier.feed``) does what
    checking the bytes need. An exception from ``source`` or ``on_chunk``
    removes the partial blob and propagates.
    """
    reader = StreamReader(source, on_chunk)
    key = _write(reader, prefix)
    return key, reader.size


def _write(reader: StreamReader, prefix: str) -> str:
    key = new_storage_key(prefix)
    try:
        stored = artifact_storage().save(key, _StreamFile(reader, name=key))
    except BaseException:
        blob_delete_quietly(key)
        raise
    return stored


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
    A blob shorter than ``start + length`` raises ``OSError`` after its last byte.
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
    return _file_chunks(handle, key, length, chunk_size)


def _file_chunks(handle, key: str, length: int, chunk_size: int) -> Iterator[bytes]:
    """``length`` bytes of ``handle`` in chunks; ``OSError`` when the file ends sooner: a response that
    declared ``length`` bytes is then cut off (the client sees a broken transfer at once) instead of
    leaving the client waiting for bytes that never come."""
    try:
        remaining = length
        while remaining > 0:
            data = handle.read(min(chunk_size, remaining))
            if not data:
                raise OSError(f"blob {key} ended {remaining} bytes before the {length} bytes asked for")
            remaining -= len(data)
            yield data
    finally:
        handle.close()


def _s3_range(storage, key: str, start: int, length: int, chunk_size: int) -> Iterator[bytes]:
    """The range as chunks, fetched as ``S3_RANGE_PART``-byte ranged GETs, ``S3_RANGE_PARALLEL`` at a time, in order.

    The first part is read before this returns (a missing object raises
    here). At most ``S3_RANGE_PARALLEL`` parts are held; a part that fails
    raises when its turn comes, after every byte before it was yielded, so
    the caller resumes from there.
    """
    from storages.utils import clean_name

    client, bucket = storage.bucket.meta.client, storage.bucket.name  # clients are thread-safe, resources not
    name = storage._normalize_name(clean_name(key))

    def part(offset: int) -> bytes:
        last = min(offset + S3_RANGE_PART, start + length) - 1
        body = client.get_object(Bucket=bucket, Key=name, Range=f"bytes={offset}-{last}")["Body"]
        try:
            return body.read()
        finally:
            body.close()

    first = part(start)
    offsets = iter(range(start + S3_RANGE_PART, start + length, S3_RANGE_PART))

    def chunks():
        with ThreadPoolExecutor(max_workers=S3_RANGE_PARALLEL, thread_name_prefix="mado-s3-range") as pool:
            pending = deque(pool.submit(part, offset) for offset in islice(offsets, S3_RANGE_PARALLEL))
            try:
                data = first
                while True:
                    view = memoryview(data)
                    for index in range(0, len(view), chunk_size):
                        yield bytes(view[index : index + chunk_size])
                    if not pending:
                        return
                    data = pending.popleft().result()
                    pending.extend(pool.submit(part, offset) for offset in islice(offsets, 1))
            finally:
                for future in pending:
                    future.cancel()

    return chunks()


def blob_size(key: str) -> int:
    """The stored size of blob ``key`` in bytes (a stat or an S3 HEAD)."""
    return artifact_storage().size(key)


def blob_iter_resuming(*, key: str, size: int, attempts: int = 4, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Yield the ``size`` bytes of blob ``key`` in order; a read that breaks resumes where it stopped
    (docs/design/worker.md#fetch).

    Each resume is a new ranged read from the first byte not yet yielded;
    after ``attempts`` consecutive failures the last error propagates.
    """
    offset, failures = 0, 0
    while offset < size:
        chunks = blob_open_range(key=key, start=offset, length=size - offset, chunk_size=chunk_size)
        try:
            for data in chunks:
                offset += len(data)
                failures = 0
                yield data
            if offset < size:
                raise OSError(f"blob {key} ended after {offset} of {size} bytes")
        except (OSError, ConnectionError, *_botocore_errors()) as exc:
            failures += 1
            if failures >= attempts:
                raise
            logger.warning("reading blob %s broke at byte %d (%s); resuming", key, offset, exc)
        finally:
            closer = getattr(chunks, "close", None)
            if closer:
                closer()


def _botocore_errors() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return ()
    return (BotoCoreError, ClientError)


# --- direct multipart upload to S3 (MADO_STORAGE=s3) -------------------------------


def s3_storage():
    """The artifact storage when it is django-storages' ``S3Storage``, else None."""
    storage = artifact_storage()
    if hasattr(storage, "bucket") and hasattr(storage, "_normalize_name") and hasattr(storage, "connection"):
        return storage
    return None


def _s3_target(key: str) -> tuple[object, str, str]:
    from storages.utils import clean_name

    storage = s3_storage()
    if storage is None:
        raise RuntimeError("the artifact storage is not S3")
    return storage.connection.meta.client, storage.bucket_name, storage._normalize_name(clean_name(key))


def s3_multipart_create(*, key: str, content_type: str = "application/x-tar") -> str:
    """Start a multipart upload of blob ``key`` (stored with ``content_type``); return its upload id."""
    client, bucket, name = _s3_target(key)
    return client.create_multipart_upload(Bucket=bucket, Key=name, ContentType=content_type)["UploadId"]


def _presigning(key: str) -> tuple[object, str, str]:
    """``_s3_target`` with a client that signs for ``MADO_S3_PUBLIC_ENDPOINT_URL`` when set: the address clients
    outside the servers' network reach S3 at (docs/deploy.md#s3-seen-from-outside). A signature covers the host, so
    the URL is signed for the public address, not rewritten afterwards; the same credentials, region and client
    settings as the storage's own."""
    client, bucket, name = _s3_target(key)
    public = settings.MADO_S3_PUBLIC_ENDPOINT_URL
    if public:
        storage = s3_storage()
        client = storage._create_session().client(
            "s3",
            region_name=storage.region_name,
            use_ssl=storage.use_ssl,
            endpoint_url=public,
            config=storage.client_config,
            verify=storage.verify,
        )
    return client, bucket, name


def s3_presign_parts(*, key: str, upload_id: str, count: int, expires_s: int) -> list[str]:
    """Presigned ``PUT`` URLs for parts 1..``count`` of the upload, valid ``expires_s`` seconds, naming the public
    S3 address when one is set (``_presigning``)."""
    client, bucket, name = _presigning(key)
    return [
        client.generate_presigned_url(
            "upload_part",
            Params={"Bucket": bucket, "Key": name, "UploadId": upload_id, "PartNumber": number},
            ExpiresIn=expires_s,
            HttpMethod="PUT",
        )
        for number in range(1, count + 1)
    ]


def s3_presign_abort(*, key: str, upload_id: str, expires_s: int) -> str:
    """A presigned ``DELETE`` URL that aborts the upload, valid ``expires_s`` seconds.

    The client that gives up on an upload aborts it with this, even when the
    mado server is the part that cannot be reached; it names the public S3 address when one is set.
    """
    client, bucket, name = _presigning(key)
    return client.generate_presigned_url(
        "abort_multipart_upload",
        Params={"Bucket": bucket, "Key": name, "UploadId": upload_id},
        ExpiresIn=expires_s,
        HttpMethod="DELETE",
    )


def s3_multipart_complete(*, key: str, upload_id: str, parts: list[dict]) -> None:
    """Complete the upload from ``parts`` (``[{"part_number": int, "etag": str}]`` ascending)."""
    client, bucket, name = _s3_target(key)
    client.complete_multipart_upload(
        Bucket=bucket,
        Key=name,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": p["part_number"], "ETag": p["etag"]} for p in parts]},
    )


def s3_multipart_abort_quietly(*, key: str, upload_id: str) -> None:
    """Abort an unfinished upload (its parts cost space); errors are logged, never raised."""
    if not upload_id:
        return
    try:
        client, bucket, name = _s3_target(key)
        client.abort_multipart_upload(Bucket=bucket, Key=name, UploadId=upload_id)
    except Exception:  # noqa: BLE001 - finished or already aborted uploads answer NoSuchUpload
        logger.info("could not abort multipart upload %s of %s", upload_id, key, exc_info=True)


def blob_stat(key: str, *, size: int | None = None) -> StoredBlob:
    """Size and SHA-256 of stored blob ``key``, read back in ``CHUNK_SIZE`` chunks (constant memory): its first
    ``size`` bytes, the size a stat or S3 HEAD gives when ``size`` is None (a caller that has just taken one passes
    its size).

    For bytes that reached the storage without passing through the server
    (an MLflow multipart upload straight to S3), and for a check of stored bytes (``checkpoints.services.integrity``);
    a broken read resumes.
    """
    size = blob_size(key) if size is None else size
    digest = hashlib.sha256()
    received = 0
    for data in blob_iter_resuming(key=key, size=size):
        digest.update(data)
        received += len(data)
    return StoredBlob(key=key, size=received, sha256=digest.hexdigest())


@dataclass(frozen=True)
class StoredStat:
    """What a stat or an S3 HEAD tells of a stored blob without reading it: ``size`` (bytes), a ``fingerprint`` that
    changes whenever the bytes are rewritten (size, modification time and inode; S3: size, ETag and LastModified), and
    ``settled``: False while a rewrite could still go unnoticed (a file modified in the last ``SETTLE_S`` seconds:
    timestamps tick coarsely, so the same fingerprint may cover two writes; Git calls such entries racy)."""

    size: int
    fingerprint: str
    settled: bool


SETTLE_S = 2


def blob_fingerprint(key: str) -> StoredStat | None:
    """``StoredStat`` of blob ``key``, None when the storage has no such object (docs/design/checkpoints.md#damage).

    One ``stat`` (FileSystemStorage) or S3 HEAD. Raises ``StorageUnreachable`` (an outage, answered 503) when the
    file system refuses the stat, or when the object is absent and so is the storage itself (``check_reachable``: a
    volume not mounted is not a missing object); S3 errors other than 404 propagate (outages too).
    """
    s3 = s3_storage()
    if s3 is not None:
        client, bucket, name = _s3_target(key)
        try:
            head = client.head_object(Bucket=bucket, Key=name)
        except Exception as exc:
            if is_missing(exc):
                check_reachable()
                return None
            raise
        size = int(head["ContentLength"])
        found = StoredStat(size, f"s3:{size}:{head.get('ETag', '')}:{head.get('LastModified', '')}", True)
    else:
        storage = artifact_storage()
        if not hasattr(storage, "path"):  # another backend: no fingerprint, so every check reads the bytes
            if storage.exists(key):
                return StoredStat(storage.size(key), "", False)
            check_reachable()
            return None
        try:
            stat = os.stat(storage.path(key))
        except FileNotFoundError:
            check_reachable()
            return None
        except OSError as exc:
            raise StorageUnreachable(f"the artifact storage cannot be read: {exc}") from exc
        settled = time.time_ns() - stat.st_mtime_ns > SETTLE_S * 1_000_000_000
        found = StoredStat(stat.st_size, f"fs:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}", settled)
    return found


def check_reachable() -> None:
    """Before an absent object is called missing: ``StorageUnreachable`` when the storage itself is absent, an S3
    bucket that does not answer HEAD or a storage root that is gone or empty (a volume not mounted leaves an empty
    mount point; a deleted object leaves its directories)."""
    try:
        if s3_storage() is not None:
            client, bucket, _name = _s3_target("")
            client.head_bucket(Bucket=bucket)
            return
        root = getattr(artifact_storage(), "location", None)
        if root is None:
            return
        with os.scandir(root) as entries:
            if next(entries, None) is not None:
                return
        raise StorageUnreachable(f"the artifact storage's root {root} is empty: is its volume mounted?")
    except StorageUnreachable:
        raise
    except Exception as exc:
        raise StorageUnreachable(f"the artifact storage cannot be read: {exc}") from exc


def is_missing(exc: BaseException) -> bool:
    """True when ``exc`` says the storage has no object under the key (FileNotFoundError, S3 404 / NoSuchKey)."""
    if isinstance(exc, FileNotFoundError):
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code")) in {"404", "NoSuchKey", "NotFound"}
    return False
