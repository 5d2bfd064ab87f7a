"""Artifacts uploaded by the MLflow client, and the checkpoints they form
(docs/design/checkpoints.md#mlflow-checkpoints, #deletion; docs/design/interfaces.md#mlflow).

A file of a ``training`` or ``fine_tuning`` Run whose path follows one of the
layouts of ``checkpoint_layouts`` (``checkpoints/step-<N>/``, a Lightning
``<stem>/<stem>.ckpt``, or, through ``logged_model_files``, the
``checkpoint-N`` directory of a Hugging Face logged model) is stored like any
artifact (streamed, SHA-256 and size computed by the server) and added to the
pending Checkpoint of its step, ``layout="files"``: one ManifestEntry per
file, pointing at its Artifact. The checkpoint becomes ``complete`` (usable
for resume) when the Run reaches a final state
(``checkpoint_files_complete_for_run``, called by ``runs.services.run_set_status``),
when a checkpoint with a higher step starts, or when its layout's own signal
comes (the single ``.ckpt`` stored), whichever comes first. The files of a
logged model complete only when that model is finalized READY: the Run's end
or a higher step ends such a checkpoint ``error`` (its upload did not
finish). Every checkpoint change of a Run serialises on the Run's row lock,
so a file never joins a checkpoint that has completed.
"""

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, CheckpointLayout, CheckpointState, ManifestEntry, StorageUsage
from checkpoints.services.artifacts import (
    artifact_replace,
    artifact_store,
    artifacts_delete_below,
    validate_artifact_path,
)
from checkpoints.services.usage import artifact_kind, usage_count, usage_move
from mado import policy
from mado.errors import Conflict, ValidationFailed
from mado_tracking.tarformat import ManifestMismatch, check_paths
from mlflow_api.artifacts.checkpoint_layouts import CheckpointFile, Completion, checkpoint_file_in
from runs.liveness import run_touch
from runs.models import FINAL_STATES, LoggedModel, Run, RunKind

logger = logging.getLogger(__name__)

CHECKPOINT_KINDS = frozenset({RunKind.TRAINING, RunKind.FINE_TUNING})


def checkpoint_file_of(*, run: Run | None, path: str, model_name: str | None = None) -> CheckpointFile | None:
    """The checkpoint file (step, path inside, layout) that artifact ``path`` is, else None: a plain artifact.

    ``path`` is a safe artifact path (``validate_artifact_path``) of ``run``,
    or of a logged model named ``model_name`` whose source Run is ``run``
    (None: logged outside a run). Only ``training`` and ``fine_tuning`` Runs
    form checkpoints (docs/design/checkpoints.md#mlflow-checkpoints).
    """
    if run is None or run.kind not in CHECKPOINT_KINDS:
        return None
    return checkpoint_file_in(path, model_name=model_name)


def mlflow_artifact_put(*, actor, run: Run, path: str, source, expected_size: int | None = None) -> Artifact:
    """Stream ``source`` into ``run``'s artifact ``path``; a checkpoint file also joins its checkpoint
    (``checkpoint_join``).

    Member or admin (else ``Forbidden``); unsafe ``path`` → ``ValidationFailed``.
    A ``checkpoints/step-N/`` file whose step cannot take files any more
    (complete, deleted or a tar checkpoint; a higher step started; the Run
    has ended) raises ``Conflict`` before any byte is stored, and again —
    removing what this call stored — if that happened meanwhile; a file of a
    stock client's layout (Lightning's ``.ckpt``) is then kept as a plain
    artifact. Re-sending the same bytes is idempotent; different bytes
    replace a plain file as on MLflow (``artifact_replace``: the old digest
    stays in its history) and raise ``Conflict`` for a checkpoint's file or
    any path under ``checkpoints/``.
    """
    path, target = require_put(actor=actor, run=run, path=path)
    run_touch(run_id=run.pk)
    if target is None or not target.layout.strict:
        artifact = artifact_replace(actor=actor, run=run, path=path, source=source, expected_size=expected_size)
        return checkpoint_join(actor=actor, run=run, target=target, artifact=artifact)
    artifact, created = artifact_store(actor=actor, run=run, path=path, source=source, expected_size=expected_size)
    return checkpoint_join(actor=actor, run=run, target=target, artifact=artifact, created=created)


def require_put(*, actor, run: Run, path: str) -> tuple[str, CheckpointFile | None]:
    """The checks before a file of ``run`` is stored: writer, safe ``path``, a strict layout's step can take it.

    Returns ``(path, checkpoint_file_of(...))``.
    """
    policy.require_run_writer(actor, run)
    path = validate_artifact_path(path)
    target = checkpoint_file_of(run=run, path=path)
    if target is not None:
        checkpoint_file_precheck(actor=actor, run=run, target=target)
    return path, target


class NameRefused(ValidationFailed):
    """A checkpoint file whose name the checkpoint format refuses (``tarformat.check_paths``): every restore would
    refuse the checkpoint, so the file is refused and its checkpoint ends ``error``
    (docs/design/checkpoints.md#names)."""


def checkpoint_file_precheck(*, actor, run: Run, target: CheckpointFile) -> None:
    """The checks before the bytes of checkpoint file ``target`` of ``run`` are stored.

    A strict layout's step that cannot take files: ``Conflict``; another layout's file then stays plain and is
    not checked further. A name the checkpoint format refuses, alone or beside the files the step's
    checkpoint already holds: ``NameRefused`` (400, naming the file and the rule) after the step's checkpoint
    ended ``error`` (``_end_refused``), so no partial checkpoint completes. ``checkpoint_add_file`` checks again
    under the Run's lock (two files uploaded at once).
    """
    with transaction.atomic():
        try:
            checkpoint = _refusal_check(Run.objects.get(pk=run.pk), target.step)
        except Conflict:
            if target.layout.strict:
                raise
            return
        refusal = _name_refusal(checkpoint, target)
    if refusal is not None:
        _end_refused(actor=actor, run=run, target=target, reason=refusal.detail)
        raise refusal


def _name_refusal(checkpoint: Checkpoint | None, target: CheckpointFile) -> NameRefused | None:
    """Why ``target.path`` cannot join ``checkpoint`` (None: not started) under the checkpoint format's name, depth
    and collision rules, checked by the one checker (``tarformat.check_paths``); None when it can.

    The checkpoint's own entry of the same path is left out: a retry or a replacement is decided elsewhere.
    """
    existing = ()
    if checkpoint is not None:
        existing = ManifestEntry.objects.filter(checkpoint=checkpoint).exclude(path=target.path)
        existing = existing.values_list("path", flat=True).iterator()
    try:
        check_paths(existing, settings.MADO_TAR_LIMITS, new=target.path)
    except ManifestMismatch as exc:
        return NameRefused(
            f"checkpoint file {target.path!r} (step {target.step}) is refused: {exc.detail}; every restore would "
            f"refuse this checkpoint, so the checkpoint at step {target.step} ends error",
            field="path",
        )
    return None


@transaction.atomic
def _end_refused(*, actor, run: Run, target: CheckpointFile, reason: str) -> None:
    """End the pending files checkpoint of ``target.step`` ``error`` with ``reason``, starting it (as ``error``) when
    it has no file yet, so the step's other files cannot form a checkpoint without the refused one."""
    locked_run = Run.objects.select_for_update().get(pk=run.pk)
    try:
        checkpoint = _refusal_check(locked_run, target.step)
    except Conflict:
        return  # it completed or ended meanwhile: nothing pending to end
    if checkpoint is None:
        checkpoint = _start(actor=actor, run=run, target=target)
    Checkpoint.objects.filter(pk=checkpoint.pk, state=CheckpointState.PENDING).update(
        state=CheckpointState.ERROR, error=reason
    )


def checkpoint_join(
    *, actor, run: Run, target: CheckpointFile | None, artifact: Artifact, created: bool = False
) -> Artifact:
    """Add the just-stored ``artifact`` of ``run`` (or of a logged model of ``run``) to its checkpoint ``target``
    (``checkpoint_add_file``; None: a plain artifact, nothing to do); returns ``artifact``.

    When the step cannot take the file (``Conflict``): a strict layout
    removes what this call stored (``created``) and raises; another keeps the
    file as a plain artifact, as an MLflow server would, so the stock
    client's training goes on (docs/design/checkpoints.md#mlflow-checkpoints).
    """
    if target is None:
        return artifact
    try:
        checkpoint_add_file(actor=actor, run=run, target=target, artifact=artifact)
    except NameRefused as exc:  # a name that joined at the same time as this one collides with it
        _remove(artifact, created)
        _end_refused(actor=actor, run=run, target=target, reason=exc.detail)
        raise
    except Conflict as exc:
        if not target.layout.strict:
            logger.info("%s of run %s stays a plain artifact: %s", artifact.path, run.external_id, exc)
            return artifact
        _remove(artifact, created)
        raise
    except BaseException:
        _remove(artifact, created and target.layout.strict)
        raise
    return artifact


def _remove(artifact: Artifact, created: bool) -> None:
    """Remove ``artifact`` and its bytes when this call ``created`` it."""
    if created:
        kind = artifact_kind(artifact)
        if Artifact.objects.filter(pk=artifact.pk).delete()[0]:
            usage_count(artifact, sign=-1, kind=kind)
        storage.blob_delete_quietly(artifact.storage_key)


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
def checkpoint_add_file(*, actor, run: Run, target: CheckpointFile, artifact: Artifact) -> Checkpoint:
    """Add stored ``artifact`` as file ``target.path`` of ``run``'s pending ``layout="files"`` checkpoint at
    ``target.step`` (docs/design/checkpoints.md#mlflow-checkpoints).

    ``artifact`` is a file of ``run`` or of a logged model of ``run``.
    Starts the checkpoint (framework: the layout's) with its first file;
    starting it closes every pending files checkpoint of the Run at a lower
    step (``_close``); a layout whose checkpoint is one file completes it at
    once.
    The Run's row is locked first (the one order every checkpoint change of
    the Run takes), then the artifact's, so the manifest records the bytes it
    holds (a replacement waits, then is refused). A file already in a
    checkpoint of the Run returns that checkpoint (a retry). ``Conflict`` as
    in ``mlflow_artifact_put``. Returns the checkpoint.
    """
    locked_run = Run.objects.select_for_update().get(pk=run.pk)
    artifact = Artifact.objects.select_for_update().get(pk=artifact.pk)
    joined = ManifestEntry.objects.filter(artifact=artifact, checkpoint__run_id=run.pk).select_related("checkpoint")
    if (entry := joined.first()) is not None:
        return entry.checkpoint
    step = target.step
    checkpoint = _refusal_check(locked_run, step)
    refusal = _name_refusal(checkpoint, target)
    if refusal is not None:
        raise refusal
    if checkpoint is None:
        checkpoint = _start(actor=actor, run=run, target=target)
    entry, created = ManifestEntry.objects.get_or_create(
        checkpoint=checkpoint,
        path=target.path,
        defaults={"size": artifact.size, "sha256": artifact.sha256, "artifact": artifact},
    )
    if not created:  # another artifact already holds this path of the checkpoint
        raise Conflict(f"{target.path} is already another file of the checkpoint at step {step}", field="path")
    was = StorageUsage.Kind.LOGGED_MODEL if artifact.logged_model_id else StorageUsage.Kind.ARTIFACT
    usage_move(artifact, to_kind=StorageUsage.Kind.CHECKPOINT_FILES, from_kind=was)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        file_count=F("file_count") + 1,
        total_bytes=F("total_bytes") + artifact.size,
        **({"includes_optimizer": True} if target.optimizer else {}),
    )
    if target.layout.completes == Completion.FILE_STORED:
        _complete(checkpoint)
    checkpoint.refresh_from_db()
    return checkpoint


def _start(*, actor, run: Run, target: CheckpointFile) -> Checkpoint:
    """Start the pending files checkpoint of ``target.step`` (the Run's row locked); starting it closes every
    pending files checkpoint of the Run at a lower step (``_close``)."""
    checkpoint = Checkpoint.objects.create(
        run_id=run.pk,
        step=target.step,
        layout=CheckpointLayout.FILES,
        framework=target.layout.framework,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    for older in Checkpoint.objects.filter(
        run_id=run.pk, step__lt=target.step, layout=CheckpointLayout.FILES, state=CheckpointState.PENDING
    ):
        _close(older)
    return checkpoint


UNFINALIZED = "The logged model holding this checkpoint was never finalized: its upload did not finish."


def _close(checkpoint: Checkpoint) -> bool:
    """A pending files checkpoint nobody adds to any more (its Run ended, a higher step started): complete it, or, when
    its files are a logged model's, end it ``error`` (only that model's READY says they all arrived). True when
    completed."""
    if ManifestEntry.objects.filter(checkpoint=checkpoint, artifact__logged_model__isnull=False).exists():
        Checkpoint.objects.filter(pk=checkpoint.pk, state=CheckpointState.PENDING).update(
            state=CheckpointState.ERROR, error=UNFINALIZED
        )
        return False
    return _complete(checkpoint)


def _complete(checkpoint: Checkpoint) -> bool:
    """pending → complete for a files checkpoint with at least one file; False when it was not pending."""
    return bool(
        Checkpoint.objects.filter(
            pk=checkpoint.pk, state=CheckpointState.PENDING, layout=CheckpointLayout.FILES, file_count__gt=0
        ).update(state=CheckpointState.COMPLETE, completed_at=timezone.now(), received={"layout": "files"}, error="")
    )


@transaction.atomic
def checkpoint_files_finish_for_model(*, model: LoggedModel, ready: bool) -> int:
    """The MLflow client finalized logged ``model``: complete (``ready``) or end ``error`` (upload failed) the
    pending files checkpoints its files joined; how many (docs/design/checkpoints.md#mlflow-checkpoints).

    Call before the model's row is locked (the Run's lock comes first).
    Idempotent; a checkpoint already complete or ended is left as it is.
    """
    if model.run_id is None:
        return 0
    Run.objects.select_for_update().filter(pk=model.run_id).first()
    pending = Checkpoint.objects.filter(
        run_id=model.run_id,
        layout=CheckpointLayout.FILES,
        state=CheckpointState.PENDING,
        manifest__artifact__logged_model=model,
    ).distinct()
    if ready:
        return sum(_complete(checkpoint) for checkpoint in pending)
    return Checkpoint.objects.filter(pk__in=[checkpoint.pk for checkpoint in pending]).update(
        state=CheckpointState.ERROR,
        error=f"The MLflow client reported that uploading logged model {model.model_id} failed; "
        "this checkpoint cannot be used.",
    )


@transaction.atomic
def checkpoint_files_complete_for_run(*, run_id: int) -> int:
    """Close every pending ``layout="files"`` checkpoint of Run ``run_id`` (``_close``: complete, or ``error``
    for a logged model's never finalized); the number completed (docs/design/checkpoints.md#mlflow-checkpoints).

    Call when the Run has reached a final state (``run_set_status``).
    Idempotent; takes the Run's row lock like ``checkpoint_add_file``, so a
    file being added either lands before the completion or is refused.
    """
    Run.objects.select_for_update().filter(pk=run_id).first()
    pending = Checkpoint.objects.filter(run_id=run_id, layout=CheckpointLayout.FILES, state=CheckpointState.PENDING)
    return sum(_close(checkpoint) for checkpoint in pending)


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
