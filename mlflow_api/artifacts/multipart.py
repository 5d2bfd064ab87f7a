"""MLflow multipart upload of a Run's artifact straight to S3 (``mpu/create|complete|abort``;
docs/design/interfaces.md#mlflow, docs/design/checkpoints.md#mlflow-checkpoints).

The same checks and the same checkpoint rules as a single PUT
(``checkpoint_files.mlflow_artifact_put``): the completed object is recorded
as the Run's artifact and a checkpoint file joins its checkpoint
(``checkpoint_files.checkpoint_join``).
"""

from django.conf import settings
from django.core import signing

from checkpoints import storage
from checkpoints.models import Artifact
from checkpoints.services.artifacts import artifact_insert, validate_artifact_path
from mado import policy
from mado.errors import Conflict, ValidationFailed
from mlflow_api.artifacts.checkpoint_files import checkpoint_join, require_put
from runs.models import Run

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
    path, _target = require_put(actor=actor, run=run, path=path)
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

    path, target = require_put(actor=actor, run=run, path=path)
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
    return checkpoint_join(actor=actor, run=run, target=target, artifact=artifact, created=created)


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
