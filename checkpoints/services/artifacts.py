"""State changes for Artifacts: streamed store, delete, Code archives
(docs/design/checkpoints.md#a-checkpoint, #deletion).

A blob is written under a fresh storage key first, then the Artifact row is
created in one transaction; the database's ``(run, path)`` unique constraint,
not a check-then-insert, decides between "new", "same content again" and
"conflict" (docs/design/house.md#idempotent). Whatever is refused leaves the stored
artifact and its bytes untouched and keeps no new bytes (docs/design/house.md#bad-input).
"""

import re

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, ManifestEntry, StorageUsage
from checkpoints.services.usage import artifact_kind, usage_add, usage_count, usage_run_id
from mado import policy
from mado.audit import audit_record
from mado.errors import Conflict, NotFound, ValidationFailed
from runs.lease import lease_check
from runs.models import Code, CodeVersion, Run
from runs.services import code_version_create

PATH_MAX = 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def validate_artifact_path(path) -> str:
    """Return ``path`` if it is a safe relative artifact path, else ``ValidationFailed`` naming ``path``.

    Safe: 1..1024 characters, relative (no leading ``/``), ``/``-separated
    segments none of which is empty, ``.`` or ``..``; no backslash, NUL or
    other control character.
    """
    if not isinstance(path, str) or not path:
        raise ValidationFailed("path must not be empty", field="path")
    if len(path) > PATH_MAX:
        raise ValidationFailed(f"path must be at most {PATH_MAX} characters", field="path")
    if "\\" in path or any(ord(char) < 32 or ord(char) == 127 for char in path):
        raise ValidationFailed("path must not contain a backslash or control characters", field="path")
    if path.startswith("/"):
        raise ValidationFailed("path must be relative, not absolute", field="path")
    if any(segment in ("", ".", "..") for segment in path.split("/")):
        raise ValidationFailed("path must not contain empty, '.' or '..' segments", field="path")
    return path


def _check_digest(expected_sha256: str | None) -> str | None:
    if expected_sha256 is None or expected_sha256 == "":
        return None
    digest = expected_sha256.strip().lower()
    if not _SHA256.match(digest):
        raise ValidationFailed("X-Mado-Sha256 must be 64 hexadecimal digits", field="X-Mado-Sha256")
    return digest


def check_received(blob: storage.StoredBlob, expected_sha256: str | None, expected_size: int | None) -> None:
    if expected_size is not None and blob.size != expected_size:
        raise ValidationFailed(
            f"upload incomplete: received {blob.size} of {expected_size} bytes; nothing was stored", field="body"
        )
    if expected_sha256 is not None and blob.sha256 != expected_sha256:
        raise ValidationFailed(
            f"content SHA-256 is {blob.sha256}, not the declared {expected_sha256}; nothing was stored",
            field="X-Mado-Sha256",
        )


def _same_or_conflict(existing: Artifact, blob: storage.StoredBlob) -> Artifact:
    if existing.sha256 == blob.sha256 and existing.size == blob.size:
        return existing
    raise Conflict(
        f"{existing.path} already holds different content (sha256 {existing.sha256}); an artifact is never overwritten",
        field="path",
        extra={"sha256": existing.sha256},
    )


def artifact_store(
    *,
    actor,
    run: Run,
    path: str,
    source,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    fencing_token: int | None = None,
) -> tuple[Artifact, bool]:
    """Stream ``source`` (anything with ``read(n)``) into ``run``'s artifact ``path``; ``(artifact, created)``.

    Member or admin of the Run's Project (else ``Forbidden``). ``path`` must
    be safe (``validate_artifact_path``). The bytes are hashed (SHA-256) and
    counted while they stream into ``runs/<run_id>/<uuid4 hex>``;
    ``expected_size`` (the request's Content-Length, bytes) catches a cut
    upload and ``expected_sha256`` (hex) a corrupted one: ``ValidationFailed``
    and nothing kept. The same content at a path already stored returns the
    stored Artifact with ``created=False`` (an SDK retry is idempotent);
    different content raises ``Conflict`` and leaves the stored one as it is.
    When the path is already taken the body is only hashed, never stored.
    ``fencing_token`` (the ``Mado-Fencing-Token`` header; None: not fenced)
    is checked before the body is read and again in the transaction that
    records it: ``LeaseLost``, nothing kept (docs/design/runs.md#one-writer-process).
    """
    policy.require_run_writer(actor, run)
    path = validate_artifact_path(path)
    expected_sha256 = _check_digest(expected_sha256)
    with transaction.atomic():  # refuse a stale writer before it streams the body
        lease_check(run_id=run.pk, token=fencing_token)
    existing = Artifact.objects.filter(run=run, path=path).first()
    if existing is not None:
        blob = storage.blob_digest(source=source)
        check_received(blob, expected_sha256, expected_size)
        return _same_or_conflict(existing, blob), False
    blob = storage.blob_write(source=source, prefix=f"runs/{run.pk}")
    try:
        check_received(blob, expected_sha256, expected_size)
        artifact, created = artifact_insert(run=run, path=path, blob=blob, fencing_token=fencing_token)
    except BaseException:
        storage.blob_delete_quietly(blob.key)
        raise
    if not created:
        storage.blob_delete_quietly(blob.key)
    return artifact, created


def artifact_replace(*, actor, run: Run, path: str, source, expected_size: int | None = None) -> Artifact:
    """Store ``source`` at ``run``'s artifact ``path``, replacing other bytes stored there (MLflow's rule,
    docs/design/interfaces.md#mlflow).

    Checks as ``artifact_store`` (writer, safe path, ``expected_size``). A
    free path is stored as ``artifact_store`` does; the same bytes again are
    a no-op; other bytes replace the stored ones, whose digest, size and the
    time are appended to ``Artifact.history`` (the old blob is then deleted).
    Paths under ``checkpoints/`` are never replaced: they raise ``Conflict``
    as ``artifact_store`` does. Two replaces at once serialize on the row.
    """
    policy.require_run_writer(actor, run)
    path = validate_artifact_path(path)
    if path.startswith("checkpoints/") or not Artifact.objects.filter(run=run, path=path).exists():
        return artifact_store(actor=actor, run=run, path=path, source=source, expected_size=expected_size)[0]
    blob = storage.blob_write(source=source, prefix=f"runs/{run.pk}")
    try:
        check_received(blob, None, expected_size)
        with transaction.atomic():
            current = Artifact.objects.select_for_update().get(run=run, path=path)
            unused = replace_content(current, blob)
    except BaseException:
        storage.blob_delete_quietly(blob.key)
        raise
    storage.blob_delete_quietly(unused)
    return current


def replace_content(current: Artifact, blob: storage.StoredBlob) -> str:
    """Point the locked row ``current`` at ``blob`` unless it holds the same bytes; the storage key now unused.

    Other bytes: the old digest, size and the time join ``current.history``
    (MLflow's overwrite, docs/design/interfaces.md#mlflow). The caller deletes the returned key's bytes
    once its transaction has committed. A file of a checkpoint (a ManifestEntry's) never changes
    (docs/design/house.md#immutable): other bytes raise ``Conflict``; the caller drops ``blob``.
    """
    if (current.sha256, current.size) == (blob.sha256, blob.size):
        return blob.key
    entry = ManifestEntry.objects.filter(artifact=current).select_related("checkpoint").first()
    if entry is not None:
        raise Conflict(
            f"{current.path} is a file of the checkpoint at step {entry.checkpoint.step}, which never changes; "
            "log it under another path",
            field="path",
            extra={"sha256": current.sha256},
        )
    unused = current.storage_key
    usage_add(
        project_id=current.project_id,
        run_id=usage_run_id(current),
        kind=artifact_kind(current),
        size=blob.size - current.size,
        files=0,
    )
    current.history = [
        *current.history,
        {
            "sha256": current.sha256,
            "size": current.size,
            "replaced_at": timezone.now().isoformat(),
        },
    ]
    current.sha256, current.size, current.storage_key = blob.sha256, blob.size, blob.key
    current.stored_fingerprint = ""
    current.save(update_fields=["sha256", "size", "storage_key", "stored_fingerprint", "history"])
    return unused


def artifact_insert(
    *, run: Run, path: str, blob: storage.StoredBlob, fencing_token: int | None = None
) -> tuple[Artifact, bool]:
    """Record ``blob`` (already stored) as ``run``'s artifact ``path``; ``(artifact, created)``.

    When the path is taken (a concurrent upload won it, or a retry): the same
    bytes return the stored row (``created`` False), other bytes raise
    ``Conflict``; the caller drops ``blob`` in both cases. A stale
    ``fencing_token`` raises ``LeaseLost`` (docs/design/runs.md#one-writer-process; None: not fenced).
    """
    try:
        with transaction.atomic():
            lease_check(run_id=run.pk, token=fencing_token)
            artifact = Artifact.objects.create(
                project_id=run.project_id, run=run, path=path, size=blob.size, sha256=blob.sha256, storage_key=blob.key
            )
            usage_count(artifact, kind=StorageUsage.Kind.ARTIFACT)
        return artifact, True
    except IntegrityError:
        existing = Artifact.objects.filter(run=run, path=path).first()
        if existing is None:
            raise
        return _same_or_conflict(existing, blob), False


def artifact_delete(*, actor, artifact: Artifact) -> None:
    """Delete ``artifact``: the row in a transaction, its bytes once that commits (docs/design/checkpoints.md#deletion).

    Project admin only (``policy.can_delete_artifacts``, else ``Forbidden``).
    A checkpoint's tar or a Code version's archive is refused with
    ``Conflict`` (delete the checkpoint through its own rules instead); the
    database foreign keys make this hold against a concurrent registration.
    """
    project = artifact.project
    policy.require_role(actor, project, policy.ADMIN)
    refusal = f"{artifact.path} is a checkpoint's or code version's file; delete the checkpoint instead"
    checkpoint = Checkpoint.objects.filter(artifact=artifact).only("pk").first()
    if checkpoint is not None:
        raise Conflict(
            f"{artifact.path} is the tar of checkpoint {checkpoint.pk}; delete the checkpoint instead", field="path"
        )
    key = artifact.storage_key
    try:
        with transaction.atomic():
            kind = artifact_kind(artifact)
            deleted, _ = Artifact.objects.filter(pk=artifact.pk).delete()
            if deleted:
                usage_count(artifact, sign=-1, kind=kind)
                transaction.on_commit(lambda: storage.blob_delete_quietly(key))
                audit_record(actor=actor, action="artifact.delete", obj=artifact, project_id=project.pk)
    except (ProtectedError, IntegrityError):
        raise Conflict(refusal, field="path") from None


def artifacts_delete_below(*, actor, files, path: str, owner: str) -> int:
    """Delete file ``path`` among ``files`` (a Run's or a logged model's Artifacts), or every one below directory
    ``path``.

    Returns the number deleted. Unsafe ``path`` → ``ValidationFailed``;
    nothing there → ``NotFound`` naming ``owner``; each file goes through
    ``artifact_delete`` (Project admin; a checkpoint's file → ``Conflict``).
    """
    path = validate_artifact_path(path)
    rows = files.select_related("project")
    artifacts = list(rows.filter(path=path) or rows.filter(path__startswith=f"{path}/").order_by("path"))
    if not artifacts:
        raise NotFound(f"artifact {path!r} of {owner} not found", field="path")
    for artifact in artifacts:
        artifact_delete(actor=actor, artifact=artifact)
    return len(artifacts)


def code_version_create_with_archive(
    *, actor, code: Code, entrypoint: list[str], archive=None, archive_name: str = "archive"
) -> CodeVersion:
    """Add the next version of ``code``, streaming the optional source ``archive`` into the storage.

    ``archive`` is anything with ``read(n)`` (an uploaded file); it is stored
    as an Artifact with ``run=NULL`` under ``codes/<code_id>/<uuid4 hex>``
    and path ``codes/<code_id>/<archive_name>``. ``entrypoint``: argv list of
    non-empty strings. Member or admin (else ``Forbidden``, checked before any
    byte is stored); a refused version keeps no bytes.
    """
    policy.require_role(actor, code.project, policy.MEMBER)
    if archive is None:
        return code_version_create(actor=actor, code=code, entrypoint=entrypoint)
    name = archive_name.replace("\\", "/").rsplit("/", 1)[-1].strip() or "archive"
    try:
        path = validate_artifact_path(f"codes/{code.pk}/{name}"[:PATH_MAX])
    except ValidationFailed:
        path = f"codes/{code.pk}/archive"
    blob = storage.blob_write(source=archive, prefix=f"codes/{code.pk}")
    try:
        with transaction.atomic():
            artifact = Artifact.objects.create(
                project_id=code.project_id,
                run=None,
                path=path,
                size=blob.size,
                sha256=blob.sha256,
                storage_key=blob.key,
            )
            usage_count(artifact, kind=StorageUsage.Kind.CODE)
            return code_version_create(actor=actor, code=code, entrypoint=entrypoint, archive=artifact)
    except BaseException:
        storage.blob_delete_quietly(blob.key)
        raise
