"""Data stages: which dataset versions a Run trains on from which step
(docs/design/runs.md#data-stages, #data-stages-sdk).

``data_stage_record`` is the only writer (append-only); the selectors read
the composition in force at a step and the history with its diffs.
``runs.services`` and ``runs.selectors`` re-export these names.

Races (docs/design/house.md#idempotent): the Run row is locked before the existing
stages are read, so two records of one Run serialize and the second sees the
first's outcome; the unique ``(run, start_step)`` constraint holds even
without that lock (SQLite), and its ``IntegrityError`` is answered like the
second record would be: the same record (identical) or a conflict.
"""

from django.db import IntegrityError, transaction
from django.db.models import Max, Prefetch
from django.utils.translation import gettext as _

from mado import policy
from mado.errors import Conflict, Forbidden, ValidationFailed
from runs.lease import lease_check
from runs.models import DatasetVersion, DataStage, Project, Run

IDS_FIELD = "input_dataset_version_ids"


def dataset_versions_of_project(
    *, project: Project, ids, field: str = IDS_FIELD, allow_empty: bool = True
) -> list[DatasetVersion]:
    """The dataset versions ``ids`` (a list of ints; duplicates kept once, order kept) of ``project``.

    Raises ``ValidationFailed`` naming ``field``: not a list of integers, an
    empty list (unless ``allow_empty``), or ids that are unknown or of
    another Project (the message lists them).
    """
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValidationFailed(f"{field} must be a list of integer dataset version ids", field=field)
    if not ids and not allow_empty:
        raise ValidationFailed(f"{field} must name the full set of dataset versions (it is empty)", field=field)
    ids = list(dict.fromkeys(ids))
    found = {v.pk: v for v in DatasetVersion.objects.filter(pk__in=ids, dataset__project=project)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise ValidationFailed(f"unknown dataset version ids in project {project.slug}: {missing}", field=field)
    return [found[i] for i in ids]


def _run_has_ended(run: Run) -> bool:
    return run.is_final or run.job_ended


def why_cannot_record_stage(*, user, run: Run) -> str | None:
    """None when ``user`` may record a data stage on ``run`` now, else the sentence shown instead of the form
    (docs/design/runs.md#data-stages).

    Reasons, first that applies: not a writer of the Run
    (``policy.why_cannot_write_run``, docs/design/runs.md#write-rule), the Run's Job has ended or the
    Run is in a final state.
    """
    reason = policy.why_cannot_write_run(user, run)
    if reason:
        return reason
    if _run_has_ended(run):
        return _("The Job has ended: data stages can only be recorded while the run is running.")
    return None


def _describe(stage: DataStage) -> dict:
    return {
        "id": stage.pk,
        "start_step": stage.start_step,
        "dataset_version_ids": sorted(stage.dataset_versions.values_list("pk", flat=True)),
        "checkpoint_id": stage.checkpoint_id,
        "metadata": stage.metadata,
    }


def _same_or_conflict(stage: DataStage, *, version_ids: set[int], checkpoint_id, metadata: dict) -> DataStage:
    recorded = _describe(stage)
    if (
        set(recorded["dataset_version_ids"]) == version_ids
        and recorded["checkpoint_id"] == checkpoint_id
        and recorded["metadata"] == metadata
    ):
        return stage
    raise Conflict(
        f"step {stage.start_step} already has a data stage (id {stage.pk}) with dataset versions "
        f"{recorded['dataset_version_ids']}, checkpoint {recorded['checkpoint_id']} and other metadata or set; "
        "data stages are immutable",
        field="start_step",
        extra={"recorded": recorded},
    )


def _checkpoint(run: Run, checkpoint_id, start_step: int):
    """The checkpoint ``checkpoint_id`` of ``run`` (None for None) that a stage starting at ``start_step`` may name."""
    if checkpoint_id is None:
        return None
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int):
        raise ValidationFailed("checkpoint_id must be an integer or null", field="checkpoint_id")
    checkpoint = run.checkpoints.filter(pk=checkpoint_id).first()
    if checkpoint is None:
        raise ValidationFailed(f"checkpoint {checkpoint_id} is not a checkpoint of run {run.pk}", field="checkpoint_id")
    if checkpoint.is_deleted:
        raise ValidationFailed(f"checkpoint {checkpoint_id} is deleted", field="checkpoint_id")
    if checkpoint.step > start_step:
        raise ValidationFailed(
            f"checkpoint {checkpoint_id} is at step {checkpoint.step}, after start_step {start_step}",
            field="checkpoint_id",
        )
    return checkpoint


@transaction.atomic
def data_stage_record(
    *,
    actor,
    run: Run,
    start_step: int,
    dataset_version_ids: list[int],
    checkpoint_id: int | None = None,
    metadata: dict | None = None,
    fencing_token: int | None = None,
) -> tuple[DataStage, bool]:
    """Record that ``run`` trains on exactly ``dataset_version_ids`` from ``start_step`` on
    (docs/design/runs.md#data-stages, #data-stages-sdk).

    Returns ``(stage, created)``. Identical content at a recorded step (same
    set, checkpoint and metadata) returns that stage with ``created`` False:
    a resend is safe. ``metadata`` is a JSON object (default ``{}``).

    Raises ``Forbidden`` (not a writer of the Run, docs/design/runs.md#write-rule); ``ValidationFailed`` naming
    the field: ``start_step`` not an integer >= 0 or not after the last
    stage's, an empty set or ids unknown / of another Project (listed),
    ``checkpoint_id`` not of this Run, deleted or after ``start_step``,
    ``metadata`` not an object; ``Conflict``: another content is recorded
    at ``start_step`` (``extra["recorded"]``), or the Run's Job has ended /
    the Run is final ("the Job has ended"); ``LeaseLost``: a stale
    ``fencing_token`` (the ``Mado-Fencing-Token`` header; None: not fenced;
    docs/design/runs.md#one-writer-process). ``run.input_dataset_versions`` is never touched.
    """
    reason = policy.why_cannot_write_run(actor, run)
    if reason:
        raise Forbidden(reason, field="run")
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValidationFailed("start_step must be an integer >= 0", field="start_step")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise ValidationFailed("metadata must be a JSON object", field="metadata")
    versions = dataset_versions_of_project(project=run.project, ids=dataset_version_ids, allow_empty=False)
    checkpoint = _checkpoint(run, checkpoint_id, start_step)
    version_ids = {v.pk for v in versions}
    lease_check(run_id=run.pk, token=fencing_token)
    run = Run.objects.select_for_update().select_related("project").get(pk=run.pk)
    existing = DataStage.objects.filter(run=run, start_step=start_step).first()
    if existing is not None:
        return _same_or_conflict(
            existing, version_ids=version_ids, checkpoint_id=checkpoint_id, metadata=metadata
        ), False
    if _run_has_ended(run):
        raise Conflict(f"the Job has ended: run {run.pk} is {run.status}; no data stage can be recorded", field="run")
    previous = DataStage.objects.filter(run=run).aggregate(last=Max("start_step"))["last"]
    if previous is not None and start_step <= previous:
        raise ValidationFailed(f"start_step must be greater than the previous stage's ({previous})", field="start_step")
    try:
        with transaction.atomic():
            stage = DataStage.objects.create(
                run=run, start_step=start_step, checkpoint=checkpoint, metadata=metadata, created_by=actor
            )
            stage.dataset_versions.set(versions)
    except IntegrityError:
        existing = DataStage.objects.filter(run=run, start_step=start_step).first()
        if existing is None:
            raise
        return _same_or_conflict(
            existing, version_ids=version_ids, checkpoint_id=checkpoint_id, metadata=metadata
        ), False
    return stage, True


def _versions(queryset):
    return queryset.select_related("dataset").order_by("dataset__name", "version", "id")


def data_composition_at(*, run: Run, step: int) -> list[DatasetVersion]:
    """The dataset versions ``run`` trained on at ``step`` (docs/design/runs.md#data-stages;
    docs/design/resume.md#continue), by dataset name then version.

    The last stage whose ``start_step <= step``; before the first stage, the
    Run's initial ``input_dataset_versions``. A Run started from a checkpoint
    (resume, continue) took over its source's steps: below the checkpoint's
    step it answers the source Run's composition (docs/design/resume.md#continue).
    """
    inherited = _inherited(run)
    if inherited is not None and step < inherited[1]:
        return data_composition_at(run=inherited[0], step=step)
    stage = DataStage.objects.filter(run=run, start_step__lte=step).order_by("-start_step").first()
    source = stage.dataset_versions if stage is not None else run.input_dataset_versions
    return list(_versions(source.all()))


def _inherited(run: Run) -> tuple[Run, int] | None:
    """``(source Run, checkpoint step)`` of a Run started from a checkpoint, else None."""
    checkpoint = run.source_checkpoint
    return None if checkpoint is None else (checkpoint.run, checkpoint.step)


def data_stage_history(*, run: Run) -> list[dict]:
    """The Run's stages in ``start_step`` order, each ``{"stage", "versions", "added", "removed"}``
    (docs/design/runs.md#data-stages).

    ``versions`` is the stage's full set; ``added`` / ``removed`` compare it
    with the set in force before it (the previous stage's, else the source
    Run's at the checkpoint a resumed or continued Run started from, else the
    Run's initial ``input_dataset_versions``). Stages have ``checkpoint`` and
    ``created_by`` loaded.
    """
    stages = list(
        DataStage.objects.filter(run=run)
        .select_related("checkpoint", "created_by")
        .prefetch_related(Prefetch("dataset_versions", queryset=_versions(DatasetVersion.objects.all())))
        .order_by("start_step")
    )
    if not stages:
        return []
    inherited = _inherited(run)
    if inherited is not None:
        before = data_composition_at(run=inherited[0], step=inherited[1])
    else:
        before = list(_versions(run.input_dataset_versions.all()))
    history = []
    for stage in stages:
        versions = list(stage.dataset_versions.all())
        now_ids, before_ids = {v.pk for v in versions}, {v.pk for v in before}
        history.append(
            {
                "stage": stage,
                "versions": versions,
                "added": [v for v in versions if v.pk not in before_ids],
                "removed": [v for v in before if v.pk not in now_ids],
            }
        )
        before = versions
    return history


def data_stage_histories(*, runs: list[Run]) -> list[list[dict]]:
    """``data_stage_history`` of each of ``runs``, in order; one query finds the Runs that have stages, so a Run
    without any costs nothing more (Compare of 20 Runs, docs/design/runs.md#data-stages;
    docs/design/interfaces.md#workspace)."""
    staged = set(DataStage.objects.filter(run__in=runs).order_by().values_list("run_id", flat=True).distinct())
    return [data_stage_history(run=run) if run.pk in staged else [] for run in runs]
