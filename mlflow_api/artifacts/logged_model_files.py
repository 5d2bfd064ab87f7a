"""Files of MLflow 3 logged models, stored like a Run's artifacts (docs/design/checkpoints.md#deletion;
docs/design/interfaces.md#mlflow).

A logged model's files are Artifacts with ``logged_model`` set and ``run``
NULL, so they never mix with the source Run's own files. They stream into
the artifact storage under ``models/<pk>/`` exactly as a Run's do; the
database's ``(logged_model, path)`` unique constraint decides between two
concurrent first uploads of one path. The ``checkpoint-N`` directory that
Hugging Face's ``MLflowCallback`` logs as a model joins the source Run's
checkpoint at step N (``checkpoint_files.checkpoint_join``,
docs/design/checkpoints.md#mlflow-checkpoints).
"""

from django.db import IntegrityError, transaction

from checkpoints import storage
from checkpoints.models import Artifact, StorageUsage
from checkpoints.services.artifacts import (
    artifacts_delete_below,
    check_received,
    replace_content,
    validate_artifact_path,
)
from checkpoints.services.usage import usage_count
from mado import policy
from mlflow_api.artifacts.checkpoint_files import checkpoint_file_of, checkpoint_file_precheck, checkpoint_join
from runs.models import LoggedModel


def logged_model_file_put(
    *, actor, model: LoggedModel, path: str, source, expected_size: int | None = None
) -> Artifact:
    """Stream ``source`` (anything with ``read(n)``) into file ``path`` of logged model ``model``.

    The model's writers (``policy.require_logged_model_writer``, else ``Forbidden``); ``path`` must be safe
    (``validate_artifact_path``, ``ValidationFailed``); ``expected_size``
    (Content-Length, bytes) catches a cut upload (``ValidationFailed``,
    nothing kept). As MLflow does, the same bytes again are a no-op and other
    bytes replace the file (the old digest stays in its history), except a
    checkpoint's file (``Conflict``). A file of the model's ``checkpoint-N``
    directory (``checkpoint_layouts``) joins checkpoint N of the model's
    source Run when ``actor`` may write that Run; when it cannot, it stays a
    plain file of the model. A checkpoint file whose name the checkpoint format refuses raises
    ``NameRefused`` (400) before any byte is stored, its checkpoint ended ``error``
    (docs/design/checkpoints.md#names).
    """
    policy.require_logged_model_writer(actor, model)
    path = validate_artifact_path(path)
    target = checkpoint_file_of(run=model.run, path=path, model_name=model.name)
    if target is not None and policy.why_cannot_write_run(actor, model.run) is not None:
        target = None
    if target is not None:  # a name the checkpoint format refuses: NameRefused before any byte is stored
        checkpoint_file_precheck(actor=actor, run=model.run, target=target)
    blob = storage.blob_write(source=source, prefix=f"models/{model.pk}")
    try:
        check_received(blob, None, expected_size)
        artifact, unused = _record(model, path, blob)
    except BaseException:
        storage.blob_delete_quietly(blob.key)
        raise
    if unused:
        storage.blob_delete_quietly(unused)
    if target is not None:
        checkpoint_join(actor=actor, run=model.run, target=target, artifact=artifact)
    return artifact


def _record(model: LoggedModel, path: str, blob: storage.StoredBlob) -> tuple[Artifact, str | None]:
    """Insert or replace the row of ``path``; ``(row, storage key no longer used or None)``."""
    for _attempt in range(2):  # a concurrent first upload of the path may win the insert: then replace its row
        try:
            with transaction.atomic():
                current = Artifact.objects.select_for_update().filter(logged_model=model, path=path).first()
                if current is not None:
                    return current, replace_content(current, blob)
                created = Artifact.objects.create(
                    project_id=model.project_id,
                    logged_model=model,
                    path=path,
                    size=blob.size,
                    sha256=blob.sha256,
                    storage_key=blob.key,
                )
                usage_count(created, kind=StorageUsage.Kind.LOGGED_MODEL)
                return created, None
        except IntegrityError:
            continue
    raise IntegrityError(f"could not record {path!r} of logged model {model.model_id}")


def logged_model_files_delete(*, actor, model: LoggedModel, path: str) -> int:
    """Delete file ``path`` of ``model``, or every file below directory ``path``; the number deleted
    (docs/design/checkpoints.md#deletion).

    Project admin only (``Forbidden``); ``NotFound`` when nothing is there.
    """
    policy.require_role(actor, model.project, policy.ADMIN)
    return artifacts_delete_below(
        actor=actor, files=model.artifacts.all(), path=path, owner=f"logged model {model.model_id}"
    )
