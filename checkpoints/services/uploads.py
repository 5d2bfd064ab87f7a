"""Checkpoint tar upload through the web process and completion (docs/design/checkpoints.md#a-checkpoint;
docs/design/worker.md#fetch, #verify, #refusal).

Two ways in, one check:

- through the web process (``checkpoint_upload``): the request body is read
  in 1 MiB chunks, written to a fresh storage key and fed to a
  ``CheckpointVerifier`` as it arrives; what it found (size, SHA-256, members) is
  kept in ``Checkpoint.received`` until ``checkpoint_complete`` compares it
  with the client's declaration;
- straight to S3 (``checkpoint_upload_parts`` → client PUTs the parts →
  ``checkpoint_complete`` with ``upload_id``): the verification task
  (``checkpoint_verify_upload``, in ``direct``) streams the object back
  through the same verifier with the declared manifest.

A checkpoint becomes ``complete`` only by one conditional UPDATE
(pending → complete) after its tar matched; any mismatch raises or records
``Checkpoint <id> <what> mismatch: …``, keeps no bytes of the failed attempt
and changes nothing else in the Run (docs/design/house.md#bad-input). Streaming happens
outside any transaction (a multi-GB upload must not hold a database lock);
the bookkeeping that follows is short, transactional and row-locked.
"""

import queue
import threading

from django.conf import settings
from django.db import transaction

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointState
from checkpoints.services._common import finalize, lock, mismatch, require_pending, require_writer
from checkpoints.services.checkpoints import discard_upload
from checkpoints.services.declaration import clean_declaration, compare_received, same_declaration
from checkpoints.services.direct import complete_direct_upload
from mado.errors import Conflict, ValidationFailed
from mado.outages import is_no_space
from mado_tracking.tarverify import CheckpointVerifier, ManifestFile, ManifestMismatch
from runs.lease import lease_check

# --- upload through the web process ----------------------------------------------------


class _CutOff(Exception):
    """The client's body broke off (socket error) before its end."""


class _Body:
    """The request body; a read error is the client's broken connection, not a storage failure."""

    def __init__(self, source):
        self._source = source

    def read(self, size=-1):
        try:
            return self._source.read(size)
        except OSError as exc:  # Django's UnreadablePostError, a reset socket
            raise _CutOff(str(exc)) from exc


class _FeedThread:
    """Runs ``feed`` on a second thread so verifying (two SHA-256 passes) overlaps receiving and writing.

    At most ``depth`` chunks wait (constant memory). The first error ``feed``
    raises is re-raised by the next ``put`` or by ``close``.
    """

    def __init__(self, feed, depth: int = 8):
        self._feed = feed
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mado-tarverify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._feed(chunk)
                except BaseException as exc:  # noqa: BLE001 - handed to the request thread
                    self._error = exc

    def put(self, chunk: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(chunk)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


def checkpoint_upload(
    *, actor, checkpoint: Checkpoint, source, expected_size: int | None, fencing_token: int | None = None
) -> dict:
    """Stream ``source`` (the request body, anything with ``read(n)``) as ``checkpoint``'s tar; return what arrived.

    A writer of the Run (docs/design/runs.md#write-rule; else ``Forbidden``, before any byte is read). The
    checkpoint must be pending (complete or deleted → ``Conflict``). The body
    is read in 1 MiB chunks into a fresh key under the Run's storage prefix
    while ``CheckpointVerifier`` parses and hashes it (docs/design/worker.md#verify: regular files
    only, no link, ``..``, absolute path or duplicate). ``expected_size``
    (Content-Length, bytes) catches a cut-off body. On any mismatch or cut:
    the partial blob is removed, ``error`` is recorded, the checkpoint stays
    pending and ``ValidationFailed`` says ``Checkpoint <id> <what> mismatch:
    …``. When the storage runs out of space (ENOSPC / EDQUOT) the reason is
    recorded in ``error`` and the ``OSError`` propagates (the API answers 507,
    ``mado.outages``). On success ``received`` = ``{storage_key, size, sha256, members}``
    replaces (and discards) a previous pending upload, and the return value
    is ``{"received_bytes": int, "sha256": hex}``. ``fencing_token`` (the
    ``Mado-Fencing-Token`` header; None: not fenced) is checked before any
    byte is read and again when the upload is recorded (``LeaseLost``, the
    bytes discarded; docs/design/runs.md#one-writer-process).
    """
    require_writer(actor, checkpoint)
    require_pending(checkpoint)
    with transaction.atomic():  # refuse a stale writer before it streams gigabytes
        lease_check(run_id=checkpoint.run_id, token=fencing_token)
    verifier = CheckpointVerifier(
        tar_size=expected_size, limits=settings.MADO_TAR_LIMITS, threads=settings.MADO_HASH_THREADS
    )
    feeder = _FeedThread(verifier.feed)
    key = ""
    try:
        try:
            key, size = storage.blob_write_through(
                source=_Body(source), prefix=f"runs/{checkpoint.run_id}", on_chunk=feeder.put
            )
        finally:
            feeder.close()
        if expected_size is not None and size < expected_size:
            raise ManifestMismatch("size", f"upload cut off: received {size} of {expected_size} bytes")
        verifier.finish()
    except (ManifestMismatch, _CutOff) as exc:
        storage.blob_delete_quietly(key)
        if isinstance(exc, _CutOff):
            exc = ManifestMismatch("size", f"upload cut off after {verifier.size} bytes ({exc})")
        message = mismatch(checkpoint.pk, exc)
        Checkpoint.objects.filter(pk=checkpoint.pk, state=CheckpointState.PENDING).update(error=message)
        raise ValidationFailed(message, field="body") from None
    except BaseException as exc:
        storage.blob_delete_quietly(key)
        if is_no_space(exc):
            _record_no_space(checkpoint, received=verifier.size, expected=expected_size)
        raise
    finally:
        verifier.close()
    received = {
        "storage_key": key,
        "size": verifier.size,
        "sha256": verifier.sha256,
        "members": [{"path": m.path, "size": m.size, "sha256": m.sha256} for m in verifier.members.values()],
    }
    try:
        _upload_record(checkpoint=checkpoint, received=received, fencing_token=fencing_token)
    except BaseException:
        storage.blob_delete_quietly(key)
        raise
    return {"received_bytes": verifier.size, "sha256": verifier.sha256}


def _record_no_space(checkpoint: Checkpoint, *, received: int, expected: int | None) -> None:
    """Record on the pending checkpoint that its tar did not fit; the OSError goes on to answer 507."""
    of = f" of {expected}" if expected is not None else ""
    message = (
        f"Checkpoint {checkpoint.pk} not stored: the artifact storage ran out of space after "
        f"{received}{of} bytes; free space, then save it again"
    )
    Checkpoint.objects.filter(pk=checkpoint.pk, state=CheckpointState.PENDING).update(error=message)


@transaction.atomic
def _upload_record(*, checkpoint: Checkpoint, received: dict, fencing_token: int | None) -> None:
    """Make ``received`` the checkpoint's current upload; the one it replaces is discarded after commit."""
    lease_check(run_id=checkpoint.run_id, token=fencing_token)  # the Run's row before the checkpoint's, as register
    row = lock(checkpoint.pk)
    require_pending(row)
    previous = row.received
    Checkpoint.objects.filter(pk=row.pk, state=CheckpointState.PENDING).update(
        received=received, declared=None, error=""
    )
    discard_upload(previous, on_commit=True)


# --- the declaration and completion ----------------------------------------------------


@transaction.atomic
def checkpoint_complete(
    *,
    actor,
    checkpoint: Checkpoint,
    tar_size: int,
    tar_sha256: str | None = None,
    manifest: list[dict] | None = None,
    manifest_sha256: str | None = None,
    upload_id: str | None = None,
    parts: list[dict] | None = None,
    fencing_token: int | None = None,
) -> Checkpoint:
    """Complete ``checkpoint`` against the client's declaration (docs/design/checkpoints.md#a-checkpoint;
    docs/design/worker.md#verify); returns the row.

    ``tar_size`` in bytes, ``tar_sha256`` hex or None (not declared: the
    SHA-256 the server computed is recorded; the strict format check and the
    per-file hashes are what protect the bytes), and either ``manifest``
    ``[{path, size, sha256}]`` (every file, sizes in bytes) or, for a large
    checkpoint, ``manifest_sha256``: the SHA-256 of that manifest's canonical
    JSON (``mado_tracking.tarverify.manifest_digest``), so no request body
    grows with the file count; the manifest is then the files the server
    found in the tar. A writer of the Run (docs/design/runs.md#write-rule). After an upload
    through the web process the declaration must equal ``received``
    exactly: then ManifestEntry rows, ``file_count``, ``total_bytes`` and the
    tar fields are written, the tar becomes the Run's artifact
    ``checkpoints/step-<N>.tar`` and one conditional UPDATE turns the state
    pending → complete. A difference raises ``ValidationFailed``
    ``Checkpoint <id> <what> mismatch: …`` and the checkpoint stays pending.
    With ``upload_id`` and ``parts`` (``[{part_number, etag}]``) the direct
    S3 upload is completed instead and ``worker.tasks.checkpoint_verify`` is
    enqueued on commit; the checkpoint stays pending until it passes.
    The same declaration again on a complete checkpoint returns it
    (idempotent); another one → ``Conflict``, as do a deleted checkpoint and
    one with no uploaded tar. A stale ``fencing_token`` (the
    ``Mado-Fencing-Token`` header; None: not fenced) raises ``LeaseLost``
    and changes nothing (docs/design/runs.md#one-writer-process).
    """
    require_writer(actor, checkpoint)
    declared = clean_declaration(
        tar_size=tar_size, tar_sha256=tar_sha256, manifest=manifest, manifest_sha256=manifest_sha256
    )
    lease_check(run_id=checkpoint.run_id, token=fencing_token)
    row = lock(checkpoint.pk)
    if row.state == CheckpointState.COMPLETE:
        return _same_completion(row, declared)
    require_pending(row)
    if upload_id is not None or parts is not None:
        return complete_direct_upload(row, declared, upload_id, parts)
    if "members" not in row.received:
        if row.received.get("upload_id"):
            raise Conflict(f"checkpoint {row.pk} is being uploaded straight to S3: complete it with its upload_id")
        raise Conflict(
            f"checkpoint {row.pk} has no uploaded tar: PUT checkpoints/{row.pk}/tar first", field="checkpoint"
        )
    return finalize(row, row.received, compare_received(row, declared))


def _same_completion(row: Checkpoint, declared: dict) -> Checkpoint:
    stored = [ManifestFile(e.path, e.size, e.sha256) for e in row.manifest.all()]
    if not same_declaration(declared, tar_size=row.tar_size, tar_sha256=row.tar_sha256, files=stored):
        raise Conflict(f"checkpoint {row.pk} is already complete with a different tar or manifest", field="checkpoint")
    return row
