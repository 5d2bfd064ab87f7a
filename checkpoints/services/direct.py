"""Direct checkpoint upload to S3 and its verification task's service (docs/design/checkpoints.md#a-checkpoint;
docs/design/worker.md#fetch, #verify).

``checkpoint_upload_parts`` starts a presigned multipart upload; the client
PUTs the parts straight to the bucket and calls ``checkpoint_complete`` with
``upload_id`` + ``parts`` (``complete_direct_upload`` here), which completes
the multipart upload and dispatches ``worker.tasks.checkpoint_verify``
through the outbox. ``checkpoint_verify_upload`` streams the object back through
``CheckpointVerifier`` with the declared manifest and completes the checkpoint or
records ``error`` (it stays pending, the object is removed).
"""

import math
import uuid

from django.conf import settings
from django.db import transaction

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointState
from checkpoints.services._common import finalize, lock, mismatch, require_pending, require_writer
from checkpoints.services.checkpoints import discard_upload
from checkpoints.services.declaration import check_members, declared_files
from mado import outbox
from mado.errors import Conflict, InternalError, ValidationFailed
from mado_tracking.tarverify import CheckpointVerifier, ManifestMismatch
from runs.lease import lease_check

VERIFY_TASK = "worker.tasks.checkpoint_verify"  # named, not imported: the worker app is above this one
S3_MAX_PARTS = 10_000
S3_MAX_OBJECT = 5 * 1024**4  # bytes


def _part_size(tar_size: int) -> int:
    """Part size in bytes: the setting (>= 8 MiB), grown in whole MiB so the parts fit S3's 10,000."""
    mib = 1024 * 1024
    wanted = max(settings.MADO_CHECKPOINT_PART_SIZE, 8 * mib, math.ceil(tar_size / S3_MAX_PARTS))
    return math.ceil(wanted / mib) * mib


@transaction.atomic
def checkpoint_upload_parts(*, actor, checkpoint: Checkpoint, tar_size: int, fencing_token: int | None = None) -> dict:
    """Start a presigned multipart upload of ``checkpoint``'s tar straight to S3
    (docs/design/checkpoints.md#a-checkpoint).

    Member or admin; the checkpoint must be pending; the artifact storage
    must be S3 (``MADO_STORAGE=s3``, else ``Conflict``: PUT the tar instead).
    ``tar_size``: bytes, 1 .. 5 TiB. Returns ``{"upload_id", "part_size",
    "urls", "abort_url"}``: one presigned ``PUT`` URL per part (part ``i`` is bytes
    ``(i-1)*part_size`` .. ``i*part_size-1``; parts of at least 8 MiB, by
    default 64 MiB, valid ``MADO_CHECKPOINT_PRESIGN_EXPIRES`` seconds) and
    a presigned ``DELETE`` URL with which a client that gives up aborts it.
    A new call replaces (and aborts) an earlier unfinished upload. A stale
    ``fencing_token`` (the ``Mado-Fencing-Token`` header; None: not fenced)
    raises ``LeaseLost`` and starts nothing (docs/design/runs.md#one-writer-process).
    """
    require_writer(actor, checkpoint)
    lease_check(run_id=checkpoint.run_id, token=fencing_token)
    if storage.s3_storage() is None:
        raise Conflict("direct upload needs the S3 artifact storage (MADO_STORAGE=s3); PUT the tar instead", field=None)
    if isinstance(tar_size, bool) or not isinstance(tar_size, int) or not 0 < tar_size <= S3_MAX_OBJECT:
        raise ValidationFailed("tar_size must be an integer from 1 to 5 TiB (bytes)", field="tar_size")
    row = lock(checkpoint.pk)
    require_pending(row)
    part_size = _part_size(tar_size)
    key = storage.new_storage_key(f"runs/{row.run_id}")
    upload_id = storage.s3_multipart_create(key=key)
    try:
        urls = storage.s3_presign_parts(
            key=key,
            upload_id=upload_id,
            count=math.ceil(tar_size / part_size),
            expires_s=settings.MADO_CHECKPOINT_PRESIGN_EXPIRES,
        )
        abort_url = storage.s3_presign_abort(
            key=key, upload_id=upload_id, expires_s=settings.MADO_CHECKPOINT_PRESIGN_EXPIRES
        )
        received = {"storage_key": key, "upload_id": upload_id, "part_size": part_size, "tar_size": tar_size}
        Checkpoint.objects.filter(pk=row.pk).update(received=received, declared=None, error="")
    except BaseException:
        storage.s3_multipart_abort_quietly(key=key, upload_id=upload_id)
        raise
    discard_upload(row.received, on_commit=True)
    return {"upload_id": upload_id, "part_size": part_size, "urls": urls, "abort_url": abort_url}


def clean_parts(parts, count: int) -> list[dict]:
    """``parts`` (``[{part_number, etag}]``, every part 1..``count`` once, in order) as S3 expects; else
    ``ValidationFailed``."""
    if not isinstance(parts, list) or not parts:
        raise ValidationFailed("parts must be a non-empty list of {part_number, etag}", field="parts")
    cleaned = []
    for index, part in enumerate(parts):
        number = part.get("part_number") if isinstance(part, dict) else None
        etag = part.get("etag") if isinstance(part, dict) else None
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= count:
            raise ValidationFailed(
                f"part_number must be an integer from 1 to {count}", field=f"parts[{index}].part_number"
            )
        if not isinstance(etag, str) or not etag.strip():
            raise ValidationFailed("etag must be the ETag the part's PUT answered", field=f"parts[{index}].etag")
        cleaned.append({"part_number": number, "etag": etag.strip()})
    numbers = [p["part_number"] for p in cleaned]
    if numbers != list(range(1, count + 1)):
        raise ValidationFailed(f"parts must list part 1 to {count} once each, in order", field="parts")
    return cleaned


def complete_direct_upload(row: Checkpoint, declared: dict, upload_id, parts) -> Checkpoint:
    """``checkpoint_complete`` for a direct S3 upload, inside its transaction and row lock.

    Checks ``upload_id`` (the current upload, else ``ValidationFailed``),
    the declared size against the one the upload was started for and the
    ``parts`` (every part once, in order); completes the multipart upload,
    stores the declaration and dispatches the verification task through the
    outbox (``mado.outbox``: sent on commit, again by beat while the broker
    is down). A
    replay after that returns the row (same declaration) or ``Conflict``.
    """
    received = row.received
    if not upload_id or received.get("upload_id") != upload_id:
        raise ValidationFailed(f"upload {upload_id!r} is not checkpoint {row.pk}'s current upload", field="upload_id")
    if received.get("uploaded"):
        if row.declared != declared:
            raise Conflict(f"checkpoint {row.pk}'s upload is being verified against another declaration")
        return row
    if declared["tar_size"] != received["tar_size"]:
        raise ValidationFailed(
            f"Checkpoint {row.pk} size mismatch: the upload was started for {received['tar_size']} bytes, "
            f"{declared['tar_size']} were declared",
            field="tar_size",
        )
    parts = clean_parts(parts, math.ceil(received["tar_size"] / received["part_size"]))
    _s3_complete(row, received, parts)
    Checkpoint.objects.filter(pk=row.pk, state=CheckpointState.PENDING).update(
        received={**received, "uploaded": True}, declared=declared, error=""
    )
    outbox.dispatch_create(
        task=VERIFY_TASK, args=[row.pk], queue=settings.MADO_CHECKPOINT_VERIFY_QUEUE, task_id=str(uuid.uuid4())
    )
    row.refresh_from_db()
    return row


def _s3_complete(row: Checkpoint, received: dict, parts: list[dict]) -> None:
    from botocore.exceptions import ClientError

    try:
        storage.s3_multipart_complete(key=received["storage_key"], upload_id=received["upload_id"], parts=parts)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "NoSuchUpload" and _blob_exists(received["storage_key"]):
            return  # completed by an earlier attempt whose commit was lost
        raise ValidationFailed(
            f"Checkpoint {row.pk} tar mismatch: the storage refused the parts "
            f"({error.get('Code')}: {error.get('Message')})",
            field="parts",
        ) from None


def _blob_exists(key: str) -> bool:
    try:
        storage.blob_size(key)
    except Exception:  # noqa: BLE001 - any failure means "cannot rely on it"
        return False
    return True


def checkpoint_verify_upload(*, checkpoint_id: int) -> str:
    """Verify a direct-to-S3 upload against its declaration, then complete it or record why not
    (docs/design/worker.md#fetch, #verify).

    Called by ``worker.tasks.checkpoint_verify``. Streams the stored object
    in 1 MiB chunks (a broken read resumes with a ranged GET) through
    ``CheckpointVerifier`` with the declared manifest (or its digest), size and SHA-256. Returns
    ``"complete"``, ``"mismatch"`` (``error`` = ``Checkpoint <id> <what>
    mismatch: …``, the object is removed, the checkpoint stays pending) or
    ``"skipped"`` (gone, not pending, or its upload was replaced meanwhile).
    A storage that cannot be read raises ``InternalError`` (transient: the
    task retries).
    """
    row = Checkpoint.objects.filter(pk=checkpoint_id).first()
    if row is None or row.state != CheckpointState.PENDING or not row.declared or not row.received.get("uploaded"):
        return "skipped"
    key, declared = row.received["storage_key"], row.declared
    verifier = CheckpointVerifier(
        declared_files(declared),
        tar_size=declared["tar_size"],
        tar_sha256=declared.get("tar_sha256"),
        limits=settings.MADO_TAR_LIMITS,
        threads=settings.MADO_HASH_THREADS,
    )
    try:
        for chunk in storage.blob_iter_resuming(key=key, size=storage.blob_size(key)):
            verifier.feed(chunk)
        verifier.finish()
        files = check_members(declared, verifier.members, world_size=row.world_size)
    except ManifestMismatch as exc:
        return _verify_record(checkpoint_id=checkpoint_id, key=key, error=mismatch(checkpoint_id, exc), files=None)
    except Exception as exc:  # noqa: BLE001 - storage trouble is ours and transient
        raise InternalError(f"checkpoint {checkpoint_id}: reading {key} failed: {exc}") from exc
    finally:
        verifier.close()
    return _verify_record(
        checkpoint_id=checkpoint_id, key=key, error="", files=files, size=verifier.size, sha256=verifier.sha256
    )


@transaction.atomic
def _verify_record(*, checkpoint_id: int, key: str, error: str, files, size: int = 0, sha256: str = "") -> str:
    row = Checkpoint.objects.select_for_update().select_related("run").filter(pk=checkpoint_id).first()
    if row is None or row.state != CheckpointState.PENDING or row.received.get("storage_key") != key:
        return "skipped"
    if error:
        Checkpoint.objects.filter(pk=row.pk, state=CheckpointState.PENDING).update(
            received={}, declared=None, error=error
        )
        discard_upload(row.received, on_commit=True)
        return "mismatch"
    finalize(row, {"storage_key": key, "size": size, "sha256": sha256}, files)
    return "complete"


def checkpoint_record_error(*, checkpoint_id: int, error: str) -> None:
    """Record ``error`` on a pending checkpoint (the verification gave up); it stays pending."""
    Checkpoint.objects.filter(pk=checkpoint_id, state=CheckpointState.PENDING).update(error=error[:10_000])
