"""Reads of Artifacts and Checkpoints for pages and the API (docs/design/house.md#where-logic-goes;
docs/design/checkpoints.md#keep-count, #deletion; docs/design/worker.md#fetch).

Every lookup is scoped to the user's Projects: another Project's artifact or
checkpoint is indistinguishable from a missing one (``NotFound``, 404). The
keep-count rule (docs/design/checkpoints.md#keep-count, #deletion) lives in ``_kept`` only.
"""

import hashlib
from collections.abc import Iterator

from django.conf import settings
from django.db.models import BooleanField, Case, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import MD5
from django.utils.translation import gettext as _

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, CheckpointLayout, CheckpointState, ManifestEntry
from mado import policy
from mado.errors import Conflict, NotFound
from runs.models import Run


def artifact_list(*, run: Run) -> QuerySet[Artifact]:
    """The stored files of ``run`` (the caller has checked visibility), ordered by path."""
    return Artifact.objects.filter(run=run).order_by("path", "id")


def artifact_get_for_user(*, user, run_id, path: str) -> Artifact:
    """The artifact ``path`` of Run ``run_id`` in one of the user's Projects; else ``NotFound`` naming ``path``."""
    try:
        run_id = int(run_id)
    except (TypeError, ValueError):
        raise NotFound(f"run {run_id!r} not found", field="run") from None
    artifact = (
        Artifact.objects.visible_to(user).select_related("project", "run").filter(run_id=run_id, path=path).first()
    )
    if artifact is None:
        raise NotFound(f"artifact {path!r} of run {run_id} not found", field="path")
    return artifact


def artifact_open_range(*, artifact: Artifact, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bytes ``start``..``end`` (inclusive offsets; ``end`` None = to the last byte) of ``artifact``, streamed.

    The caller has checked ``0 <= start <= end < artifact.size``. Returns an
    iterator of chunks of at most 1 MiB; close it to release the file or the
    S3 connection. Used by downloads with HTTP Range (docs/design/worker.md#fetch: a broken
    download resumes where it stopped).
    """
    last = artifact.size - 1 if end is None else min(end, artifact.size - 1)
    return storage.blob_open_range(key=artifact.storage_key, start=start, length=last - start + 1)


def artifact_delete_blockers(*, user, run: Run, artifacts) -> dict[int, str | None]:
    """The sentence a page shows in place of each artifact's Delete button: ``{artifact id: reason or None}``
    (docs/design/checkpoints.md#deletion).

    Project admins only (``mado.policy``); a checkpoint's tar is deleted
    through its checkpoint's rules, never as a plain file. Advisory:
    ``services.artifact_delete`` checks again (and answers ``Conflict``).
    """
    artifacts = list(artifacts)
    if not policy.can_delete_artifacts(user, run.project):
        reason = policy.why_not(user, run.project, policy.ADMIN)
        return {artifact.pk: reason for artifact in artifacts}
    tar_steps = dict(
        Checkpoint.objects.filter(artifact_id__in=[a.pk for a in artifacts]).values_list("artifact_id", "step")
    )
    reason = _("This file is the tar of the checkpoint at step %(step)s: delete the checkpoint on the Checkpoints tab.")
    return {a.pk: reason % {"step": tar_steps[a.pk]} if a.pk in tar_steps else None for a in artifacts}


# --- checkpoints (docs/design/checkpoints.md#a-checkpoint, #keep-count, #deletion) ------------------------------------


def checkpoint_keep_count() -> int:
    """K: how many of a Run's newest complete checkpoints are kept in view and protected
    (``MMT_CHECKPOINT_KEEP_COUNT``)."""
    return settings.MMT_CHECKPOINT_KEEP_COUNT


def _kept(run_ref) -> QuerySet[Checkpoint]:
    """The one keep-count rule (docs/design/checkpoints.md#keep-count, #deletion): the newest K complete checkpoints of
    a Run, by step.

    ``run_ref`` is a run id or ``OuterRef("run_id")``. Everything that
    flags, lists or protects checkpoints by the keep count goes through here.
    """
    return (
        Checkpoint.objects.filter(run_id=run_ref, state=CheckpointState.COMPLETE)
        .order_by("-step")
        .values("pk")[: checkpoint_keep_count()]
    )


def with_keep_flag(checkpoints: QuerySet[Checkpoint]) -> QuerySet[Checkpoint]:
    """Annotate ``within_keep_count`` (bool) on each row."""
    return checkpoints.annotate(
        within_keep_count=Case(
            When(pk__in=Subquery(_kept(OuterRef("run_id"))), then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
    )


def checkpoint_kept_ids(*, run_id: int) -> set[int]:
    """Ids of the checkpoints of Run ``run_id`` inside the keep count (see ``_kept``)."""
    return set(_kept(run_id).values_list("pk", flat=True))


def checkpoint_list_for_run(
    *, run: Run, include_older: bool, include_unusable: bool = False, include_failed: bool = False
) -> tuple[QuerySet[Checkpoint], int]:
    """The Run's checkpoints for its Checkpoint tab and the API: ``(checkpoints, hidden_older_count)``
    (docs/design/checkpoints.md#keep-count).

    ``checkpoints`` is newest step first, each annotated ``within_keep_count``
    (bool: among the newest K complete ones, K = ``MMT_CHECKPOINT_KEEP_COUNT``).
    Only ``complete`` checkpoints are listed unless ``include_unusable``
    (then pending and deleted ones too, never flagged as kept), or, with
    ``include_failed``, pending ones whose upload failed (``error`` says
    why, e.g. the storage was full) and corrupt ones (a scrub found their
    stored bytes altered), so the reason shows. Without
    ``include_older`` only the kept complete ones (plus, with
    ``include_unusable``, the unusable ones) are listed and
    ``hidden_older_count`` says how many complete ones were left out; with it,
    the count is 0. Leaving the list never deletes anything. The caller has
    checked that the user sees ``run``.
    """
    checkpoints = with_keep_flag(Checkpoint.objects.filter(run=run)).select_related("created_by")
    if not include_unusable:
        shown = Q(state=CheckpointState.COMPLETE)
        if include_failed:
            shown |= Q(state=CheckpointState.PENDING) & ~Q(error="") | Q(state=CheckpointState.CORRUPT)
        checkpoints = checkpoints.filter(shown)
    hidden = 0
    if not include_older:
        complete = Checkpoint.objects.filter(run=run, state=CheckpointState.COMPLETE).count()
        hidden = max(complete - checkpoint_keep_count(), 0)
        checkpoints = checkpoints.filter(Q(within_keep_count=True) | ~Q(state=CheckpointState.COMPLETE))
    return checkpoints.order_by("-step"), hidden


def checkpoint_get_for_user(*, user, checkpoint_id) -> Checkpoint:
    """The checkpoint ``checkpoint_id`` of a Run in one of the user's Projects, annotated ``within_keep_count``.

    Any state (pending, complete, deleted). Another Project's checkpoint and
    a missing one alike raise ``NotFound`` (404, docs/design/house.md#one-policy).
    """
    try:
        checkpoint_id = int(checkpoint_id)
    except (TypeError, ValueError):
        raise NotFound(f"checkpoint {checkpoint_id!r} not found", field="checkpoint") from None
    checkpoint = (
        with_keep_flag(Checkpoint.objects.visible_to(user))
        .select_related("run__project", "artifact", "created_by")
        .filter(pk=checkpoint_id)
        .first()
    )
    if checkpoint is None:
        raise NotFound(f"checkpoint {checkpoint_id} not found", field="checkpoint")
    return checkpoint


def checkpoint_manifest(*, checkpoint: Checkpoint) -> QuerySet[ManifestEntry]:
    """The files of ``checkpoint`` (``path``, ``size`` in bytes, hex ``sha256``) by path; empty until complete."""
    return ManifestEntry.objects.filter(checkpoint=checkpoint).order_by("path")


def checkpoint_download_refusal(*, checkpoint: Checkpoint, layout: str) -> str | None:
    """Why ``checkpoint`` cannot be downloaded as ``layout`` (``"tar"``: ``checkpoints/{id}/tar``; ``"files"``:
    ``checkpoints/{id}/files/<path>``), or None (docs/design/checkpoints.md#mlflow-checkpoints).

    Only a complete checkpoint is downloaded, and only in the form it is stored in: one tar, or one file per
    manifest entry (saved through MLflow). The sentence says what to call instead.
    """
    cid = checkpoint.pk
    if checkpoint.state != CheckpointState.COMPLETE:
        return f"checkpoint {cid} is {checkpoint.state}: only a complete checkpoint can be downloaded"
    if checkpoint.layout == layout:
        return None
    if checkpoint.layout == CheckpointLayout.FILES:
        return (
            f"checkpoint {cid} is made of separate files (saved through MLflow), not one tar: download each file "
            f"with GET checkpoints/{cid}/files/<path>, the paths listed in the manifest of GET checkpoints/{cid}/"
        )
    return f"checkpoint {cid} is stored as one tar: download it with GET checkpoints/{cid}/tar"


def checkpoint_file_artifact(*, checkpoint: Checkpoint, path: str) -> Artifact:
    """The stored Artifact holding file ``path`` (relative POSIX path, as in the manifest) of complete
    ``layout="files"`` ``checkpoint`` (docs/design/checkpoints.md#mlflow-checkpoints; docs/design/worker.md#fetch).

    ``path`` is only ever compared with the manifest's paths (through the
    manifest's unique index on the path's MD5), never used to reach storage,
    so ``..``, absolute or odd paths simply match nothing. Raises
    ``Conflict`` (409) with ``checkpoint_download_refusal``'s sentence, or
    ``NotFound`` (404) naming ``path`` when the manifest holds no such file.
    """
    refusal = checkpoint_download_refusal(checkpoint=checkpoint, layout=CheckpointLayout.FILES)
    if refusal is not None:
        raise Conflict(refusal, field="checkpoint")
    entry = None
    try:
        digest = hashlib.md5(path.encode("utf-8"), usedforsecurity=False).hexdigest()
    except UnicodeEncodeError:
        digest = None
    if digest is not None and "\x00" not in path:  # PostgreSQL text holds no NUL
        entry = (
            ManifestEntry.objects.annotate(path_md5=MD5("path"))
            .select_related("artifact")
            .filter(checkpoint=checkpoint, path_md5=digest, path=path)
            .first()
        )
    if entry is None or entry.artifact is None:
        raise NotFound(f"checkpoint {checkpoint.pk} has no file {path!r}", field="path")
    return entry.artifact


def checkpoint_sources(checkpoints: QuerySet[Checkpoint]) -> dict[int, Run]:
    """``{checkpoint id: the first Run (by id) resumed or continued from it}`` for ``checkpoints``, in one query."""
    sources: dict[int, Run] = {}
    for run in Run.objects.filter(source_checkpoint__in=checkpoints.values("pk")).order_by("pk"):
        sources.setdefault(run.source_checkpoint_id, run)
    return sources


def checkpoint_delete_refusal(
    *, checkpoint: Checkpoint, kept_ids: set[int], sources: dict[int, Run] | None = None
) -> str | None:
    """Why ``checkpoint`` may not be deleted by anyone (docs/design/checkpoints.md#deletion), or None.

    ``kept_ids`` comes from ``checkpoint_kept_ids`` (the service passes the
    ids it read under its row locks). Reasons: already deleted; inside the
    keep count; the source checkpoint of a Run; registered as a model version (``registered_as``, a fact the model
    registry keeps on the row). ``sources``: ``checkpoint_sources`` of many checkpoints at once (a plan over a
    whole Project), else the Run is looked up here.
    """
    if checkpoint.state == CheckpointState.DELETED:
        return _("The checkpoint at step %(step)s is already deleted.") % {"step": checkpoint.step}
    if checkpoint.pk in kept_ids:
        return _(
            "The checkpoint at step %(step)s is one of the newest %(keep)s complete checkpoints of this run, "
            "which are kept: it cannot be deleted."
        ) % {"step": checkpoint.step, "keep": checkpoint_keep_count()}
    if sources is None:
        source_of = Run.objects.filter(source_checkpoint_id=checkpoint.pk).order_by("pk").first()
    else:
        source_of = sources.get(checkpoint.pk)
    if source_of is not None:
        return _(
            "The checkpoint at step %(step)s is the source checkpoint of run %(run)s (#%(id)s) and cannot be deleted."
        ) % {"step": checkpoint.step, "run": source_of, "id": source_of.pk}
    if checkpoint.registered_as:
        return _(
            "The checkpoint at step %(step)s is registered as model version %(versions)s and cannot be deleted: "
            "delete that model version first."
        ) % {"step": checkpoint.step, "versions": checkpoint.registered_as}
    return None


def checkpoint_delete_blocker(*, user, checkpoint: Checkpoint) -> str | None:
    """The sentence a page shows in place of the Delete button, or None when the user may delete
    (docs/design/checkpoints.md#deletion).

    Project admins only (``mado.policy``), then ``checkpoint_delete_refusal``.
    Advisory: ``services.checkpoint_delete`` checks again under row locks.
    """
    project = checkpoint.run.project
    if not policy.can_delete_artifacts(user, project):
        return policy.why_not(user, project, policy.ADMIN)
    return checkpoint_delete_refusal(checkpoint=checkpoint, kept_ids=checkpoint_kept_ids(run_id=checkpoint.run_id))


def checkpoint_delete_blockers(*, user, run: Run, checkpoints) -> dict[int, str | None]:
    """``checkpoint_delete_blocker`` for several checkpoints of ``run`` at once: ``{checkpoint id: reason or None}``."""
    checkpoints = list(checkpoints)
    if not policy.can_delete_artifacts(user, run.project):
        reason = policy.why_not(user, run.project, policy.ADMIN)
        return {checkpoint.pk: reason for checkpoint in checkpoints}
    kept = checkpoint_kept_ids(run_id=run.pk)
    return {
        checkpoint.pk: checkpoint_delete_refusal(checkpoint=checkpoint, kept_ids=kept) for checkpoint in checkpoints
    }
