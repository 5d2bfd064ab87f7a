"""Checkpoint registration, deletion and locking for use (docs/design/checkpoints.md#a-checkpoint, #deletion).

Registration is idempotent by ``Idempotency-Key`` and refused by the
database's ``(run, step)`` and ``(run, idempotency_key)`` unique constraints,
never by a check-then-insert (docs/design/house.md#idempotent). Deletion and any use of a
checkpoint as a Run's source serialise on the checkpoint's row lock, so a
deleted checkpoint never becomes a source and a source is never deleted.
"""

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, Q

from checkpoints import selectors, storage
from checkpoints.models import Artifact, Checkpoint, CheckpointDeletion, CheckpointLayout, CheckpointState
from checkpoints.services import deletion
from checkpoints.services.metadata import clean_checkpoint_metadata
from checkpoints.services.shards import clean_world_size
from mado import policy
from mado.audit import audit_record
from mado.errors import Conflict, NotFound, RunEnded, ValidationFailed
from runs.lease import lease_check
from runs.models import FINAL_STATES, Run

FRAMEWORK_MAX = 50
IDEMPOTENCY_KEY_MAX = 200


def _clean_step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValidationFailed("step must be an integer (the number of steps completed)", field="step")
    if step < 0:
        raise ValidationFailed(f"step must be >= 0, not {step}", field="step")
    return step


def _clean_key(idempotency_key) -> str | None:
    if idempotency_key is None:
        return None
    key = str(idempotency_key).strip()
    if not key or len(key) > IDEMPOTENCY_KEY_MAX:
        raise ValidationFailed(
            f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} characters", field="Idempotency-Key"
        )
    return key


def _replay(existing: Checkpoint, step: int) -> tuple[Checkpoint, bool]:
    if existing.step != step:
        raise Conflict(
            f"this Idempotency-Key already registered the checkpoint at step {existing.step} in this run",
            field="Idempotency-Key",
        )
    return existing, False


def _step_taken(step: int) -> Conflict:
    return Conflict(f"step {step} is already saved in this run", field="step")


@transaction.atomic
def checkpoint_register(
    *,
    actor,
    run: Run,
    step: int,
    framework: str = "",
    includes_optimizer: bool = False,
    world_size: int | None = None,
    metadata: dict | None = None,
    idempotency_key: str | None = None,
    fencing_token: int | None = None,
) -> tuple[Checkpoint, bool]:
    """Register a pending checkpoint of ``run`` at ``step`` (steps completed); ``(checkpoint, created)``
    (docs/design/checkpoints.md#a-checkpoint; docs/design/runs.md#one-writer-process).

    Only a writer of the Run (``policy.why_cannot_write_run``, docs/design/runs.md#write-rule; else
    ``Forbidden``); a Run in a final state takes no new checkpoint
    (``RunEnded``, 409; a retry of a registration that succeeded before the
    end returns its checkpoint). ``step`` is an
    integer >= 0 and ``framework`` at most 50 characters (else
    ``ValidationFailed`` naming the field). ``idempotency_key`` (1..200
    characters, one per ``log_checkpoint`` call) makes a retry return the
    same row with ``created=False``; the same key for another step, or any
    other registration of a step that already has a checkpoint (pending,
    complete or deleted), raises ``Conflict`` "step N is already saved in
    this run". The database's unique constraints decide, so two concurrent
    registrations cannot both win.

    ``fencing_token`` (the ``Mado-Fencing-Token`` header; None: not fenced)
    is checked under the Run's row lock (``LeaseLost`` when stale) and kept
    in ``Checkpoint.lease_token``. A pending tar checkpoint at ``step``
    registered under an older token (a process that was taken over) is
    discarded with its stored bytes, and the registration proceeds. So is a
    checkpoint at ``step`` (or with this key) that ended ``error`` (the
    janitor gave up on it): the SDK's next start may save that step again.

    ``world_size`` (int >= 1) is required with ``framework="torch-dcp"``
    and refused with any other (``ValidationFailed`` naming it): such a
    checkpoint completes only with every rank's shard (docs/design/worker.md#distributed,
    ``checkpoints.services.shards``). ``metadata`` (a JSON object, ``clean_checkpoint_metadata``; else
    ``ValidationFailed`` naming it) is kept as sent (docs/design/checkpoints.md#metadata); a replay keeps the
    first registration's.
    """
    policy.require_run_writer(actor, run)
    step = _clean_step(step)
    key = _clean_key(idempotency_key)
    framework = (framework or "").strip()
    if len(framework) > FRAMEWORK_MAX:
        raise ValidationFailed(f"framework must be at most {FRAMEWORK_MAX} characters", field="framework")
    world_size = clean_world_size(framework, world_size)
    metadata = clean_checkpoint_metadata(metadata)
    lease_check(run_id=run.pk, token=fencing_token)
    _replace_ended_in_error(run_id=run.pk, step=step, key=key)
    if key is not None:
        existing = Checkpoint.objects.filter(run=run, idempotency_key=key).first()
        if existing is not None:
            return _replay(existing, step)
    _refuse_ended(run)
    if fencing_token is not None:
        _take_over_pending(run_id=run.pk, step=step, token=fencing_token)
    try:
        with transaction.atomic():
            checkpoint = Checkpoint.objects.create(
                run=run,
                step=step,
                framework=framework,
                world_size=world_size,
                includes_optimizer=bool(includes_optimizer),
                metadata=metadata,
                idempotency_key=key,
                created_by=actor if actor.is_authenticated else None,
                lease_token=run.lease_token if fencing_token is None else fencing_token,
            )
    except IntegrityError:
        existing = Checkpoint.objects.filter(run=run, idempotency_key=key).first() if key else None
        if existing is not None:
            return _replay(existing, step)
        if Checkpoint.objects.filter(run=run, step=step).exists():
            raise _step_taken(step) from None
        raise
    if Artifact.objects.filter(run=run, path=checkpoint.artifact_path).exists():  # raising rolls the row back
        raise Conflict(
            f"{checkpoint.artifact_path} is already a file of this run; the step cannot hold a checkpoint", field="step"
        )
    return checkpoint, True


def _replace_ended_in_error(*, run_id: int, step: int, key: str | None) -> None:
    """Delete the ``error`` checkpoints at ``step`` or with ``key`` (their uploads were already discarded)."""
    same = Q(step=step) | Q(idempotency_key=key) if key is not None else Q(step=step)
    try:
        with transaction.atomic():
            Checkpoint.objects.filter(same, run_id=run_id, state=CheckpointState.ERROR).delete()
    except ProtectedError:  # a data stage names it: the registration then answers "step N is already saved"
        return


def _refuse_ended(run: Run) -> None:
    """``RunEnded`` (409) when ``run`` is in a final state, read under its row lock: an ended Run takes no new
    checkpoint through any API until a resume reopens it (docs/design/runs.md#write-rule)."""
    status = Run.objects.select_for_update().filter(pk=run.pk).values_list("status", flat=True).first()
    if status in FINAL_STATES:
        raise RunEnded(f"run {run.external_id} has ended ({status}): resume it before saving checkpoints", field="run")


def _take_over_pending(*, run_id: int, step: int, token: int) -> None:
    """Discard the pending tar checkpoint at ``step`` left by an older writer than ``token`` (row locked;
    docs/design/runs.md#one-writer-process).

    Its stored bytes go once this commits. A checkpoint a data stage names
    is kept (the registration then answers "step N is already saved").
    """
    old = (
        Checkpoint.objects.select_for_update()
        .filter(
            run_id=run_id, step=step, state=CheckpointState.PENDING, layout=CheckpointLayout.TAR, lease_token__lt=token
        )
        .first()
    )
    if old is None:
        return
    try:
        with transaction.atomic():
            old.delete()
    except ProtectedError:
        return
    discard_upload(old.received, on_commit=True)


@transaction.atomic
def checkpoint_delete(*, actor, checkpoint: Checkpoint) -> Checkpoint:
    """Delete ``checkpoint``: its row stays with state ``deleted``, its stored bytes go once this commits
    (docs/design/checkpoints.md#deletion).

    Project admin only (``policy.can_delete_artifacts``, else ``Forbidden``).
    Refused with ``Conflict`` and the reason (``selectors.checkpoint_delete_refusal``)
    when the checkpoint is inside the keep count (newest
    ``MMT_CHECKPOINT_KEEP_COUNT`` complete checkpoints of its Run) or is the
    source checkpoint of any Run. Deleting a deleted checkpoint returns it
    unchanged. Race-free: every checkpoint row of the Run is locked (in id
    order) before the rules are read, and a Run that takes a checkpoint as
    its source locks that row first (``checkpoint_lock_for_use``), so one of
    the two waits for the other and then sees its outcome.
    """
    run = checkpoint.run
    policy.require_role(actor, run.project, policy.ADMIN)
    row = deletion.lock_run_checkpoints(run.pk).get(checkpoint.pk)
    if row is None:
        raise NotFound(f"checkpoint {checkpoint.pk} not found", field="checkpoint")
    if row.state == CheckpointState.DELETED:
        return row
    refusal = selectors.checkpoint_delete_refusal(checkpoint=row, kept_ids=selectors.checkpoint_kept_ids(run_id=run.pk))
    if refusal:
        raise Conflict(refusal, field="checkpoint")
    row_state = row.state
    row, _freed = deletion.delete_locked(row=row, actor=actor, cause=CheckpointDeletion.Cause.HAND)
    audit_record(
        actor=actor,
        action="checkpoint.delete",
        obj=row,
        project_id=run.project_id,
        changes={"state": [row_state, row.state]},
    )
    return row


def checkpoint_lock_for_use(*, checkpoint_id: int) -> Checkpoint:
    """Lock checkpoint ``checkpoint_id``'s row and return it if it is complete; else ``Conflict``
    (docs/design/checkpoints.md#deletion; docs/design/resume.md#from-a-checkpoint, #continue).

    Call inside the transaction that creates a Run whose ``source_checkpoint``
    is this checkpoint, before creating it: ``checkpoint_delete`` takes the
    same lock, so the checkpoint cannot be deleted between this check and the
    commit of the new Run. Must run inside ``transaction.atomic``.
    """
    row = Checkpoint.objects.select_for_update().filter(pk=checkpoint_id).first()
    if row is None:
        raise NotFound(f"checkpoint {checkpoint_id} not found", field="checkpoint")
    if row.state != CheckpointState.COMPLETE:
        raise Conflict(
            f"the checkpoint at step {row.step} is {row.state}, not complete; it cannot be used", field="checkpoint"
        )
    return row


def discard_upload(received: dict, *, on_commit: bool) -> None:
    """Remove what an upload left in the storage (the blob, an unfinished S3 multipart upload).

    ``received`` is a ``Checkpoint.received`` that no row refers to any more;
    with ``on_commit`` the removal waits for the current transaction's commit.
    """
    key = (received or {}).get("storage_key")
    if not key:
        return
    upload_id = None if received.get("uploaded") else received.get("upload_id")

    def discard():
        if upload_id:
            storage.s3_multipart_abort_quietly(key=key, upload_id=upload_id)
        storage.blob_delete_quietly(key)

    if on_commit:
        transaction.on_commit(discard)
    else:
        discard()
