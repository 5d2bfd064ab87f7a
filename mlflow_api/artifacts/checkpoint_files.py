"""Artifacts uploaded by the MLflow client, and the checkpoints they form
(docs/design/checkpoints.md#mlflow-checkpoints, #deletion; docs/design/interfaces.md#mlflow).

A file PUT under ``checkpoints/step-<int>/`` of a ``training`` or
``fine_tuning`` Run is stored like any artifact (streamed, SHA-256 and size
computed by the server) and added to the pending Checkpoint of that step,
``layout="files"``: one ManifestEntry per file, pointing at its Artifact.
The checkpoint becomes ``complete`` (usable for resume) when the Run reaches
a final state (``checkpoint_files_complete_for_run``, called by
``runs.services.run_set_status``) or when a checkpoint with a higher step
starts, whichever comes first. Every checkpoint change of a Run serialises on
the Run's row lock, so a file never joins a checkpoint that has completed.
"""

import re

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, CheckpointLayout, CheckpointState, ManifestEntry
from checkpoints.services.artifacts import (
    artifact_insert,
    artifact_replace,
    artifact_store,
    artifacts_delete_below,
    validate_artifact_path,
)
from mado import policy
from mado.errors import Conflict, ValidationFailed
from runs.liveness import run_touch
from runs.models import FINAL_STATES, Run, RunKind

CHECKPOINT_KINDS = frozenset({RunKind.TRAINING, RunKind.FINE_TUNING})
_CHECKPOINT_FILE = re.compile(r"^checkpoints/step-(0|[1-9][0-9]{0,17})/(.+)$")


def checkpoint_file_of(*, run: Run, path: str) -> tuple[int, str] | None:
    """``(step, path inside the checkpoint)`` when artifact ``path`` of ``run`` belongs to a checkpoint, else None.

    Only ``training`` and ``fine_tuning`` Runs form checkpoints (docs/design/checkpoints.md#mlflow-checkpoints);
    ``path`` is a safe artifact path (``validate_artifact_path``).
    """
    if run.kind not in CHECKPOINT_KINDS:
        return None
    match = _CHECKPOINT_FILE.match(path)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def mlflow_artifact_put(*, actor, run: Run, path: str, source, expected_size: int | None = None) -> Artifact:
    """Stream ``source`` into ``run``'s artifact ``path`` (``artifact_store``); a checkpoint file also joins its
    checkpoint.

    Member or admin (else ``Forbidden``); unsafe ``path`` → ``ValidationFailed``.
    A checkpoint file (``checkpoint_file_of``) whose step cannot take files
    any more (complete, deleted or a tar checkpoint; a higher step started;
    the Run has ended) raises ``Conflict`` before any byte is stored, and
    again — removing what this call stored — if that happened meanwhile.
    Re-sending the same bytes is idempotent; different bytes replace a file
    outside ``checkpoints/`` as on MLflow (``artifact_replace``: the old
    digest stays in its history) and raise ``Conflict`` for a checkpoint's.
    """
    path, target = _require_put(actor=actor, run=run, path=path)
    run_touch(run_id=run.pk)
    if target is None:
        return artifact_replace(actor=actor, run=run, path=path, source=source, expected_size=expected_size)
    artifact, created = artifact_store(actor=actor, run=run, path=path, source=source, expected_size=expected_size)
    return _join_checkpoint(actor=actor, run=run, target=target, artifact=artifact, created=created)


def _require_put(*, actor, run: Run, path: str) -> tuple[str, tuple[int, str] | None]:
    """The checks before a file of ``run`` is stored: writer, safe ``path``, its checkpoint step can take it.

    Returns ``(path, checkpoint_file_of(...))``.
    """
    policy.require_run_writer(actor, run)
    path = validate_artifact_path(path)
    target = checkpoint_file_of(run=run, path=path)
    if target is not None:
        with transaction.atomic():
            _refusal_check(Run.objects.get(pk=run.pk), target[0])
    return path, target


def _join_checkpoint(*, actor, run: Run, target, artifact: Artifact, created: bool) -> Artifact:
    """Add a just-stored ``artifact`` to its checkpoint (``target``); on refusal remove what this call stored."""
    if target is None:
        return artifact
    try:
        checkpoint_add_file(actor=actor, run=run, step=target[0], path=target[1], artifact=artifact)
    except BaseException:
        if created:
            Artifact.objects.filter(pk=artifact.pk).delete()
            storage.blob_delete_quietly(artifact.storage_key)
        raise
    return artifact


# --- MLflow multipart upload straight to S3 (mpu/create|complete|abort) ----------------------------------

S3_MAX_PARTS = 10_000
_MPU_SALT = "mado.mlflow-artifacts.mpu"


def mlflow_multipart_create(*, actor, run: Run, path: str, num_parts) -> dict:
    """Start an S3 multipart upload of ``run``'s artifact ``path`` in ``num_parts`` parts (1..10,000).

    Same checks as ``mlflow_artifact_put`` (writer, safe path, a checkpoint
    step that can still take files). The artifact storage must be S3.
    Returns MLflow's ``{"upload_id", "credentials": [{"part_number", "url",
    "headers"}]}``: one presigned ``upload_part`` URL per part, valid
    ``MADO_CHECKPOINT_PRESIGN_EXPIRES`` seconds. ``upload_id`` is a signed
    token naming the blob, the Run and the path, so it can only complete or
    abort this upload.
    """
    path, _target = _require_put(actor=actor, run=run, path=path)
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or not 1 <= num_parts <= S3_MAX_PARTS:
        raise ValidationFailed(f"num_parts must be an integer from 1 to {S3_MAX_PARTS}", field="num_parts")
    if storage.s3_storage() is None:
        raise Conflict("multipart upload needs the S3 artifact storage", field=None)
    key = storage.new_storage_key(f"runs/{run.pk}")
    upload_id = storage.s3_multipart_create(key=key, content_type="application/octet-stream")
    try:
        urls = storage.s3_presign_parts(
            key=key, upload_id=upload_id, count=num_parts, expires_s=settings.MADO_CHECKPOINT_PRESIGN_EXPIRES
        )
    except BaseException:
        storage.s3_multipart_abort_quietly(key=key, upload_id=upload_id)
        raise
    token = signing.dumps({"r": run.pk, "p": path, "k": key, "u": upload_id, "n": num_parts}, salt=_MPU_SALT)
    credentials = [{"part_number": number, "url": url, "headers": {}} for number, url in enumerate(urls, start=1)]
    return {"upload_id": token, "credentials": credentials}


def _upload_of(*, run: Run, path: str, upload_id) -> dict:
    """The upload ``upload_id`` (from ``mlflow_multipart_create``) of ``run``'s ``path``, else ``ValidationFailed``."""
    try:
        upload = signing.loads(upload_id, salt=_MPU_SALT) if isinstance(upload_id, str) else None
    except signing.BadSignature:
        upload = None
    if not isinstance(upload, dict) or upload.get("r") != run.pk or upload.get("p") != path:
        raise ValidationFailed(f"upload_id is not an upload of {path!r} of run {run.external_id}", field="upload_id")
    return upload


def mlflow_multipart_complete(*, actor, run: Run, path: str, upload_id, parts) -> Artifact:
    """Complete the S3 multipart upload and record it as ``run``'s artifact ``path``, like a single PUT.

    ``parts``: MLflow's ``[{"part_number", "etag", "url"}]``, every part once,
    ascending (``ValidationFailed`` otherwise, or when S3 refuses them). The
    size comes from a HEAD, the SHA-256 from reading the object back in
    1 MiB chunks. The same content at a stored path is a no-op (the new
    object is removed), different content → ``Conflict``; a ``checkpoints/
    step-N/`` file joins checkpoint N as a PUT's does.
    """
    from checkpoints.services.direct import clean_parts

    path, target = _require_put(actor=actor, run=run, path=path)
    upload = _upload_of(run=run, path=path, upload_id=upload_id)
    key = upload["k"]
    _s3_complete(key=key, upload_id=upload["u"], parts=clean_parts(parts, upload["n"]))
    try:
        blob = storage.blob_stat(key)
        artifact, created = artifact_insert(run=run, path=path, blob=blob)
    except BaseException:
        storage.blob_delete_quietly(key)
        raise
    if not created and artifact.storage_key != key:
        storage.blob_delete_quietly(key)
    return _join_checkpoint(actor=actor, run=run, target=target, artifact=artifact, created=created)


def _s3_complete(*, key: str, upload_id: str, parts: list[dict]) -> None:
    from botocore.exceptions import ClientError

    try:
        storage.s3_multipart_complete(key=key, upload_id=upload_id, parts=parts)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "NoSuchUpload":
            try:
                storage.blob_size(key)
                return  # completed by an earlier attempt
            except Exception:  # noqa: BLE001, S110 - not there: the upload is gone
                pass
        raise ValidationFailed(
            f"the storage refused the parts ({error.get('Code')}: {error.get('Message')})", field="parts"
        ) from None


def mlflow_multipart_abort(*, actor, run: Run, path: str, upload_id) -> None:
    """Abort the S3 multipart upload ``upload_id`` of ``run``'s ``path``: its parts are removed (writer only)."""
    policy.require_run_writer(actor, run)
    path = validate_artifact_path(path)
    upload = _upload_of(run=run, path=path, upload_id=upload_id)
    storage.s3_multipart_abort_quietly(key=upload["k"], upload_id=upload["u"])


def _refusal_check(run: Run, step: int) -> Checkpoint | None:
    """The pending files checkpoint of ``step`` (None: not started yet); ``Conflict`` when it cannot take a file."""
    if run.status in FINAL_STATES:
        raise Conflict(f"run {run.pk} has ended ({run.status}); its checkpoints are complete", field="path")
    existing = Checkpoint.objects.filter(run_id=run.pk, step=step).first()
    if existing is not None:
        if existing.layout != CheckpointLayout.FILES or existing.state != CheckpointState.PENDING:
            raise Conflict(f"the checkpoint at step {step} is {existing.state}; it can no longer change", field="path")
        return existing
    higher = Checkpoint.objects.filter(run_id=run.pk, step__gt=step).order_by("-step").first()
    if higher is not None:
        raise Conflict(
            f"a checkpoint at step {higher.step} already started; step {step} can no longer be saved", field="path"
        )
    return None


@transaction.atomic
def checkpoint_add_file(*, actor, run: Run, step: int, path: str, artifact: Artifact) -> Checkpoint:
    """Add stored ``artifact`` as file ``path`` of ``run``'s pending ``layout="files"`` checkpoint at ``step``
    (docs/design/checkpoints.md#mlflow-checkpoints).

    Starts the checkpoint with its first file; starting it completes every
    pending files checkpoint of the Run at a lower step. The Run's row is
    locked first (the one order every checkpoint change of the Run takes).
    Adding the same file again is a no-op. ``Conflict`` as in
    ``mlflow_artifact_put``. Returns the checkpoint.
    """
    locked_run = Run.objects.select_for_update().get(pk=run.pk)
    checkpoint = _refusal_check(locked_run, step)
    if checkpoint is None:
        checkpoint = Checkpoint.objects.create(
            run_id=run.pk,
            step=step,
            layout=CheckpointLayout.FILES,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        for older in Checkpoint.objects.filter(
            run_id=run.pk, step__lt=step, layout=CheckpointLayout.FILES, state=CheckpointState.PENDING
        ):
            _complete(older)
    entry, created = ManifestEntry.objects.get_or_create(
        checkpoint=checkpoint,
        path=path,
        defaults={"size": artifact.size, "sha256": artifact.sha256, "artifact": artifact},
    )
    if created:
        Checkpoint.objects.filter(pk=checkpoint.pk).update(
            file_count=F("file_count") + 1, total_bytes=F("total_bytes") + artifact.size
        )
    elif entry.artifact_id != artifact.pk:  # (run, path) is unique, so this is a broken invariant
        raise Conflict(f"{path} is already another file of the checkpoint at step {step}", field="path")
    checkpoint.refresh_from_db()
    return checkpoint


def _complete(checkpoint: Checkpoint) -> bool:
    """pending → complete for a files checkpoint with at least one file; False when it was not pending."""
    return bool(
        Checkpoint.objects.filter(
            pk=checkpoint.pk, state=CheckpointState.PENDING, layout=CheckpointLayout.FILES, file_count__gt=0
        ).update(state=CheckpointState.COMPLETE, completed_at=timezone.now(), received={"layout": "files"}, error="")
    )


@transaction.atomic
def checkpoint_files_complete_for_run(*, run_id: int) -> int:
    """Complete every pending ``layout="files"`` checkpoint of Run ``run_id``; the number completed
    (docs/design/checkpoints.md#mlflow-checkpoints).

    Call when the Run has reached a final state (``run_set_status``).
    Idempotent; takes the Run's row lock like ``checkpoint_add_file``, so a
    file being added either lands before the completion or is refused.
    """
    Run.objects.select_for_update().filter(pk=run_id).first()
    pending = Checkpoint.objects.filter(run_id=run_id, layout=CheckpointLayout.FILES, state=CheckpointState.PENDING)
    return sum(_complete(checkpoint) for checkpoint in pending)


@transaction.atomic
def mlflow_artifact_delete(*, actor, run: Run, path: str) -> int:
    """Delete ``run``'s artifact ``path``, or every artifact below directory ``path``; the number deleted
    (docs/design/checkpoints.md#deletion).

    Project admin only (``Forbidden``). ``NotFound`` when nothing is there.
    All or nothing: a checkpoint's file (or tar) among them raises
    ``Conflict`` and nothing is deleted; bytes go once the delete commits.
    """
    policy.require_role(actor, run.project, policy.ADMIN)
    return artifacts_delete_below(
        actor=actor, files=Artifact.objects.filter(run=run), path=path, owner=f"run {run.external_id}"
    )
