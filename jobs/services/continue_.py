"""Continue training from a checkpoint with a changed data mix (docs/design/resume.md#continue, #continue-lineage).

(``continue`` is a Python keyword, hence the module's trailing underscore.)

The protocol is resume's (``resume.py``) without its source-state rules:
check who asks (``mado.policy.why_cannot_continue``), lock the checkpoint
with ``checkpoint_lock_for_use`` (so it cannot be deleted before this
commits, docs/design/checkpoints.md#deletion), then create the Run (``new_job_run``: parent + source
checkpoint, kind inherited) and its Job (``create_job``, sent to the queue on
commit). The worker treats ``continue`` like ``resume``: it fetches, verifies
and extracts the source checkpoint and sets ``MMT_RESUME_*``. The source Run
is only read.
"""

import json

from django.db import transaction
from django.utils.translation import gettext as _

from checkpoints.models import Checkpoint
from checkpoints.services import checkpoint_lock_for_use
from jobs.models import Job, JobKind, Queue
from jobs.selectors import job_for_run
from jobs.services._common import clean_nproc_per_node, create_job, new_job_run, once_per_request, require_enabled
from mado import policy
from mado.errors import Conflict, Forbidden, NotFound, ValidationFailed
from runs.models import CodeVersion, ParameterChange
from runs.stages import data_composition_at, data_stage_record, dataset_versions_of_project


def _check_code_version(source_run, code_version: CodeVersion) -> CodeVersion:
    if code_version.code.project_id != source_run.project_id:
        raise NotFound(f"code version {code_version.pk} not found", field="code_version_id")
    source_version = source_run.code_version
    if source_version is not None and code_version.code_id != source_version.code_id:
        raise ValidationFailed(
            _("code_version_id must be a version of Code '%(code)s' (the Code run %(run)s ran)")
            % {"code": source_version.code.name, "run": source_run.pk},
            field="code_version_id",
        )
    return code_version


def _record_data_change(*, actor, run, source_run, checkpoint: Checkpoint, versions) -> None:
    """A data stage at the checkpoint's step when the new set differs from the source's there
    (docs/design/runs.md#data-stages; docs/design/resume.md#continue).

    Below that step the new Run answers the source's composition
    (``data_composition_at``), so the data-history tab shows what was added
    and removed, and the code learns it through ``MMT_DATASET_VERSION_IDS``.
    """
    before = {v.pk for v in data_composition_at(run=source_run, step=checkpoint.step)}
    after = [v.pk for v in versions]
    if set(after) == before or not after:  # a stage names a non-empty set (docs/design/runs.md#data-stages-sdk)
        return
    data_stage_record(
        actor=actor,
        run=run,
        start_step=checkpoint.step,
        dataset_version_ids=after,
        metadata={
            "continued_from_checkpoint_id": checkpoint.pk,
            "added": sorted(set(after) - before),
            "removed": sorted(before - set(after)),
        },
    )


def _record_parameter_changes(*, actor, run, source_run) -> None:
    """One ``ParameterChange`` per parameter whose value the continue changed from the source Run's (absent there:
    ``old_value`` None), so the verdict names it as changed on purpose (docs/design/resume.md#declared-changes).
    ``lease_token`` 0: made before the Run's first start."""
    before = source_run.parameters or {}
    ParameterChange.objects.bulk_create(
        ParameterChange(run=run, key=key, old_value=before.get(key), new_value=new, lease_token=0, changed_by=actor)
        for key, new in sorted((run.parameters or {}).items())
        if json.dumps(before.get(key), sort_keys=True) != json.dumps(new, sort_keys=True)
    )


@transaction.atomic
def run_continue_from_checkpoint(
    *,
    actor,
    checkpoint: Checkpoint,
    code_version: CodeVersion,
    queue: Queue,
    parameters: dict | None = None,
    dataset_version_ids: list[int],
    name: str = "",
    request_key: str | None = None,
    nproc_per_node: int | None = None,
) -> Job:
    """Continue training from ``checkpoint``'s weights as a new Run and Job (kind ``continue``;
    docs/design/resume.md#continue, #continue-lineage).

    Member or admin of the checkpoint's Project; the source Run (the
    checkpoint's) may be in any state, with or without a Job. The new Run
    (``pending``, created by ``actor``) inherits the source's kind, records
    ``parent`` = the source Run and ``source_checkpoint``, and starts with
    ``dataset_version_ids`` (ids of the Project's dataset versions; may
    differ from the source's, e.g. the composition at the checkpoint's step
    plus new versions) as its initial inputs; when they differ from the
    source's set at the checkpoint's step a data stage at that step records
    the change (``_record_data_change``). ``parameters`` is a JSON
    object (None: the source's, copied); each value that differs from the
    source's is recorded as a ``ParameterChange``
    (``_record_parameter_changes``). ``code_version`` must be a version
    of the source Run's Code when the source has one. ``name`` defaults to
    "<source> · continued from step N". The Job runs on ``queue`` (enabled)
    and is sent to the worker on commit. ``request_key`` (the form's token or
    the API's ``Idempotency-Key``): the same key again by the same user
    returns the first Job (a double-clicked "Launch Job"; docs/design/house.md#idempotent).
    ``nproc_per_node`` (1..256; None: the source Run's Job's, else 1) may
    differ from the source's: a sharded checkpoint is resharded on load (docs/design/worker.md#distributed).

    Raises ``Forbidden`` (viewer; not a member), ``NotFound`` (code version
    of another Project), ``Conflict`` (the checkpoint is not ``complete``:
    pending or deleted), ``ValidationFailed`` naming the field
    (``input_dataset_version_ids`` unknown or of another Project,
    ``code_version_id`` of another Code, ``parameters`` not an object,
    disabled ``queue``).
    """
    checkpoint = Checkpoint.objects.select_related("run__project", "run__code_version__code").get(pk=checkpoint.pk)
    source_run = checkpoint.run
    reason = policy.why_cannot_continue(actor, checkpoint)
    if reason:
        raise (Conflict if policy.can_write_runs(actor, source_run.project) else Forbidden)(reason, field="checkpoint")
    if parameters is not None and not isinstance(parameters, dict):
        raise ValidationFailed(_("parameters must be a JSON object"), field="parameters")
    versions = dataset_versions_of_project(project=source_run.project, ids=dataset_version_ids)
    code_version = _check_code_version(source_run, code_version)
    queue = require_enabled(queue)
    source_job = job_for_run(run=source_run)
    nproc_per_node = clean_nproc_per_node(nproc_per_node, default=source_job.nproc_per_node if source_job else 1)

    def create(key: str | None) -> Job:
        locked = checkpoint_lock_for_use(checkpoint_id=checkpoint.pk)  # Conflict unless complete; blocks deletion
        run_name = (name or "").strip() or (
            f"{source_run.name or source_run.external_id} · continued from step {locked.step}"
        )
        run = new_job_run(
            source=source_run,
            created_by=actor,
            name=run_name,
            code_version=code_version,
            parent=source_run,
            source_checkpoint=locked,
            parameters=parameters,
            dataset_versions=versions,
        )
        _record_data_change(actor=actor, run=run, source_run=source_run, checkpoint=locked, versions=versions)
        _record_parameter_changes(actor=actor, run=run, source_run=source_run)
        # No automatic retries: a retry starts from scratch (docs/design/resume.md#retry), which would drop the weights
        # continued from; restarts resume from its own checkpoints (the Project's default, #restarts).
        return create_job(
            run=run,
            code_version=code_version,
            queue=queue,
            kind=JobKind.CONTINUE,
            created_by=actor,
            max_retries=0,
            max_restarts=source_run.project.job_max_restarts,
            resumed_from=source_run,
            request_key=key,
            nproc_per_node=nproc_per_node,
        )

    return once_per_request(actor=actor, request_key=request_key, create=create)
