"""State changes through the MLflow API (docs/design/interfaces.md#mlflow).

Every function checks the actor through ``mado.policy`` (member writes) and
raises ``MlflowError`` or a ``mado.errors`` user error (translated by the view).

Rules shared with the native API:

- params are the Run's ``parameters``; logging a key again with the same
  value is a no-op, with another value 400 INVALID_PARAMETER_VALUE (MLflow's rule);
- metric points are stored by ``runs.metrics.metrics_ingest``. Retried POSTs
  never duplicate a point: points equal on (key, step, timestamp, value) to a
  stored point of the run, or to an earlier one of the same batch, are
  dropped, and the batch goes in with an ``Idempotency-Key`` derived from the
  SHA-256 of its content, so two concurrent copies of one batch are stored
  once (the ``MetricBatch`` unique constraint decides);
- logging to a finished run is allowed (as MLflow does); a final status is
  kept by ``run_set_status`` (asking for another final one → 400 INVALID_STATE),
  except that RUNNING reopens an ended run (``run_reopen``, MLflow's
  ``start_run(run_id=...)``);
- experiment ``0`` is the user's "Default" Project, made on first use;
- runs are soft-deleted (``deleted_at``) and restorable, as MLflow does.
"""

import hashlib
import json
import uuid

from django.db import IntegrityError, transaction
from django.utils import timezone

from mado import policy
from mado.audit import audit_record
from mado.errors import Conflict
from mlflow_api.errors import (
    INVALID_PARAMETER_VALUE,
    INVALID_STATE,
    RESOURCE_ALREADY_EXISTS,
    RESOURCE_DOES_NOT_EXIST,
    MlflowError,
)
from mlflow_api.tracking import selectors
from mlflow_api.tracking.translate import FROM_MLFLOW_STATUS, KIND_TAG, RUN_NAME_TAG, param_str
from runs import services as run_services
from runs.liveness import run_touch
from runs.metric_batch import parse_value
from runs.metrics import metrics_ingest
from runs.models import FINAL_STATES, MetricPoint, Project, Run, RunKind, RunStatus, RunTag

MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100
KEY_MAX, PARAM_VALUE_MAX, TAG_VALUE_MAX = 250, 6000, 8000


def _bad(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def int64(value, name: str, *, default: int | None = None) -> int | None:
    """An int64 field of an MLflow request: a JSON number or a string of digits (protobuf's JSON for int64)."""
    if value in (None, ""):
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _bad(f"{name} must be an integer")
    try:
        number = int(value)
    except ValueError:
        raise _bad(f"{name} must be an integer") from None
    if not -(2**63) <= number < 2**63:
        raise _bad(f"{name} is out of range")
    return number


def key_values(items, name: str, limit: int, value_max: int) -> list[tuple[str, str]]:
    """MLflow's ``[{key, value}]`` list ``name`` as pairs; 400 INVALID_PARAMETER_VALUE naming the first bad item.

    At most ``limit`` items; keys 1..250 characters, values at most
    ``value_max``; no NUL. A missing or null value is "".
    """
    if items in (None, ""):
        return []
    if not isinstance(items, list) or len(items) > limit:
        raise _bad(f"{name} must be a list of at most {limit} {{key, value}} objects")
    pairs = []
    for index, item in enumerate(items):
        key = item.get("key") if isinstance(item, dict) else None
        value = item.get("value", "") if isinstance(item, dict) else None
        if not isinstance(key, str) or not key or len(key) > KEY_MAX or "\x00" in key:
            raise _bad(f"{name}[{index}].key must be a non-empty string of at most {KEY_MAX} characters")
        if value is None:
            value = ""
        if not isinstance(value, str) or len(value) > value_max or "\x00" in value:
            raise _bad(f"{name}[{index}].value must be a string of at most {value_max} characters")
        pairs.append((key, value))
    return pairs


def experiment_create(*, actor, name: str, artifact_location: str = "") -> Project:
    """Create a Project named ``name`` with ``actor`` as admin (slug from the name).

    ``artifact_location`` must be empty: mado chooses where artifacts live
    (a client-chosen ``file:``/``s3:`` URI would point the server elsewhere).
    RESOURCE_ALREADY_EXISTS (400) when the user already sees a Project of that
    name; INVALID_PARAMETER_VALUE (400) naming nothing when its slug is taken
    by a Project the user cannot see (so ``mlflow.set_experiment`` fails
    with that sentence instead of silently returning None; docs/design/runs.md#write-rule).
    """
    if artifact_location:
        raise _bad("artifact_location is chosen by mado and must be empty")
    if Project.objects.visible_to(actor).filter(name=name.strip()).exists():
        raise MlflowError(RESOURCE_ALREADY_EXISTS, f"Experiment '{name}' already exists.")
    try:
        return run_services.project_create(user=actor, name=name)
    except Conflict:
        raise _bad("this experiment name cannot be used: choose another name") from None


DEFAULT_EXPERIMENT_ID = "0"
DEFAULT_EXPERIMENT_NAME = "Default"


def experiment_for_id(*, actor, experiment_id) -> Project:
    """The Project of MLflow experiment ``experiment_id``; ``"0"`` is the actor's "Default" Project.

    MLflow scripts that never set an experiment write to experiment 0. Here
    it is a Project named "Default" per user, created on first use with the
    user as admin (``Project.default_for`` is unique: two first uses at once
    make one), never for a ``read`` token or a service account
    (RESOURCE_DOES_NOT_EXIST, 404, until a write makes it). Any other id:
    ``selectors.experiment_get`` (404 when invisible).
    """
    if str(experiment_id) != DEFAULT_EXPERIMENT_ID:
        return selectors.experiment_get(user=actor, experiment_id=experiment_id)
    project = Project.objects.filter(default_for=actor).first()
    if project is not None:
        return project
    if policy.why_cannot_create_project(actor):  # a read token or a service account: nothing is made on its behalf
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No experiment with id={DEFAULT_EXPERIMENT_ID} exists for you yet.")
    slug_base = f"default-{actor.username}"[:90]
    for attempt in range(5):
        slug = slug_base if attempt == 0 else f"{slug_base}-{uuid.uuid4().hex[:6]}"
        try:
            with transaction.atomic():
                project = run_services.project_create(user=actor, name=DEFAULT_EXPERIMENT_NAME, slug=slug)
                Project.objects.filter(pk=project.pk).update(default_for=actor)
                return project
        except (Conflict, IntegrityError):
            found = Project.objects.filter(default_for=actor).first()
            if found is not None:  # a concurrent first use made it
                return found
    raise MlflowError(INVALID_STATE, "could not create the Default experiment; try again")


def experiment_tag_set(*, actor, project: Project, key: str, value: str | None) -> None:
    """Set (``value`` a string) or remove (``value`` None) the experiment tag ``key`` of ``project``.

    Writers of the Project only (``Forbidden``); key 1..250 characters, value
    at most 5,000 (MLflow's limits, 400 INVALID_PARAMETER_VALUE); removing a
    missing tag is RESOURCE_DOES_NOT_EXIST (404), as on MLflow.
    """
    policy.require_role(actor, project, policy.MEMBER)
    pairs = key_values([{"key": key, "value": value or ""}], "tag", 1, 5000)
    with transaction.atomic():
        locked = Project.objects.select_for_update().get(pk=project.pk)
        tags = dict(locked.tags or {})
        if value is None:
            if key not in tags:
                raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No tag with name: {key} in experiment {project.pk}")
            del tags[key]
        else:
            tags[pairs[0][0]] = pairs[0][1]
        Project.objects.filter(pk=project.pk).update(tags=tags)


@transaction.atomic
def run_create(*, actor, project: Project, run_name: str = "", tags=None) -> Run:
    """Create a running Run in ``project`` with a 32-hex run id (MLflow's form).

    ``tags`` is MLflow's ``[{key, value}]``: ``mado.kind`` sets the kind
    (default training; 400 for an unknown kind), ``mlflow.runName`` the name
    (``run_name`` wins), the rest are stored as RunTags.
    """
    policy.require_role(actor, project, policy.MEMBER)
    tag_map = dict(key_values(tags, "tags", MAX_TAGS, TAG_VALUE_MAX))
    kind = tag_map.pop(KIND_TAG, RunKind.TRAINING)
    if kind not in RunKind.values:
        raise _bad(f"tag {KIND_TAG} must be one of {', '.join(RunKind.values)}")
    name = run_name or tag_map.pop(RUN_NAME_TAG, "")
    tag_map.pop(RUN_NAME_TAG, None)
    run = run_services.run_create(actor=actor, project=project, name=name, kind=kind, external_id=uuid.uuid4().hex)
    RunTag.objects.bulk_create([RunTag(run=run, key=k, value=v) for k, v in tag_map.items()])
    return run


def run_update(*, actor, run: Run, status: str | None = None, run_name: str | None = None) -> Run:
    """Change a Run's status (MLflow name) and/or name.

    RUNNING on an ended Run reopens it (``run_reopen``); another final
    status than the stored one → INVALID_STATE (``run_set_status``).
    """
    policy.require_run_writer(actor, run)
    if run_name:
        Run.objects.filter(pk=run.pk).update(name=run_name[:200])
        run.name = run_name[:200]
    if status:
        if str(status).upper() not in FROM_MLFLOW_STATUS:
            raise _bad(f"status must be one of {', '.join(FROM_MLFLOW_STATUS)}")
        status = FROM_MLFLOW_STATUS[str(status).upper()]
        if status == RunStatus.RUNNING and run.status in FINAL_STATES:
            return run_reopen(actor=actor, run=run)
        run = run_services.run_set_status(actor=actor, run=run, status=status)
        run_touch(run_id=run.pk)
    return run


def run_reopen(*, actor, run: Run) -> Run:
    """Reopen an ended Run, as an MLflow server does for ``start_run(run_id=R)`` / ``MLFLOW_RUN_ID``
    (docs/design/interfaces.md#mlflow).

    Whoever may write the Run (``Forbidden`` otherwise). A finished, failed,
    aborted, crashed or preempted Run becomes running again: ``ended_at``
    and ``ended_reason`` cleared, the silence clock restarted. A Run that
    sent heartbeats (an SDK process, a Job's: those resume by id through
    the SDK) is refused with INVALID_STATE saying how to resume it.
    A conditional UPDATE on the old status: of two reopens one wins, the
    other finds it running and returns it.
    """
    policy.require_run_writer(actor, run)
    if run.heartbeat_at is not None:
        raise MlflowError(
            INVALID_STATE,
            f"run {run.external_id} was written by the mado SDK; resume it with "
            f"start_run(id={run.external_id!r}, resume='allow') instead",
        )
    before = run.status
    reopened = Run.objects.filter(pk=run.pk, status__in=FINAL_STATES).update(
        status=RunStatus.RUNNING, ended_at=None, ended_reason="", last_write_at=timezone.now()
    )
    run.refresh_from_db()
    if reopened:
        changes = {"status": [before, run.status]}
        audit_record(actor=actor, action="run.reopen", obj=run, project_id=run.project_id, changes=changes)
    return run


def run_delete(*, actor, run: Run, deleted: bool) -> Run:
    """Soft-delete (``deleted``) or restore ``run``, as MLflow's ``delete_run`` / ``restore_run``
    (docs/design/interfaces.md#mlflow).

    Whoever may write the Run (``Forbidden``). Nothing is removed: the Run,
    its metrics, files and checkpoints stay (Jobs and derived Runs refer to
    them); a deleted Run answers ``lifecycle_stage: deleted`` and leaves
    MLflow searches unless deleted runs are asked for. Idempotent both ways.
    """
    policy.require_run_writer(actor, run)
    now = timezone.now() if deleted else None
    changed = Run.objects.filter(pk=run.pk, deleted_at__isnull=deleted).update(deleted_at=now)
    run.refresh_from_db()
    if changed:  # asked twice: recorded once
        audit_record(
            actor=actor,
            action="run.delete" if deleted else "run.restore",
            obj=run,
            object_repr=f"run {run.pk} {run.name}",
            project_id=run.project_id,
            changes={"deleted": [not deleted, deleted]},
        )
    return run


def _params_log(run: Run, params: list[tuple[str, str]]) -> None:
    if not params:
        return
    locked = Run.objects.select_for_update().get(pk=run.pk)
    merged = dict(locked.parameters)
    for key, value in params:
        if key in merged and param_str(merged[key]) != value:
            raise _bad(
                f"Changing param values is not allowed. Param with key='{key}' was already logged with "
                f"value='{param_str(merged[key])}' for run ID='{run.external_id}'. "
                f"Attempted logging new value '{value}'."
            )
        merged[key] = value
    if merged != locked.parameters:
        Run.objects.filter(pk=run.pk).update(parameters=merged)
        run.parameters = merged


def _tags_set(run: Run, tags: list[tuple[str, str]]) -> None:
    for key, value in tags:
        if key == RUN_NAME_TAG:
            Run.objects.filter(pk=run.pk).update(name=value[:200])
        elif key != KIND_TAG:  # the kind is chosen at creation; later changes are ignored
            RunTag.objects.update_or_create(run=run, key=key, defaults={"value": value})


def _points(metrics) -> list[dict]:
    if metrics in (None, ""):
        return []
    if not isinstance(metrics, list) or len(metrics) > MAX_METRICS:
        raise _bad(f"metrics must be a list of at most {MAX_METRICS} metrics")
    points = []
    for index, metric in enumerate(metrics):
        if not isinstance(metric, dict):
            raise _bad(f"metrics[{index}] must be an object")
        points.append(
            {
                "key": metric.get("key"),
                "value": metric.get("value"),
                "step": int64(metric.get("step"), f"metrics[{index}].step", default=0),
                "timestamp": int64(metric.get("timestamp"), f"metrics[{index}].timestamp"),
            }
        )
    return points


def _new_points(run: Run, points: list[dict]) -> list[dict]:
    """``points`` without those already stored or repeated in the batch, on (key, step, timestamp, value)."""

    def identity(p):
        return (p["key"], p["step"], p["timestamp"], MetricPoint.to_db_value(parse_value(p["value"], "value")))

    valid = [
        p for p in points if isinstance(p["key"], str) and isinstance(p["timestamp"], int) and p["value"] is not None
    ]
    if len(valid) != len(points):
        return points  # let metrics_ingest name the bad field
    seen = set(
        MetricPoint.objects.filter(run=run, key__in={p["key"] for p in points})
        .at_steps(
            min(p["step"] for p in points),
            max(p["step"] for p in points),
        )
        .values_list("key", "step", "timestamp", "value")
    )
    fresh = []
    for point in points:
        ident = identity(point)
        if ident not in seen:
            seen.add(ident)
            fresh.append(point)
    return fresh


def log_batch(*, actor, run: Run, metrics=None, params=None, tags=None) -> int:
    """MLflow ``log-batch`` (and the single log-metric / log-param / set-tag): all or nothing.

    Returns the count of metric points stored (duplicates of stored points
    are skipped, see the module docstring). Forbidden (403) unless the actor may write to the Run
    (docs/design/runs.md#write-rule); 400 INVALID_PARAMETER_VALUE naming the first bad field.
    """
    policy.require_run_writer(actor, run)
    param_pairs = key_values(params, "params", MAX_PARAMS, PARAM_VALUE_MAX)
    tag_pairs = key_values(tags, "tags", MAX_TAGS, TAG_VALUE_MAX)
    points = _points(metrics)
    run_touch(run_id=run.pk)  # the silence clock of a writer without heartbeats (docs/design/runs.md#liveness)
    with transaction.atomic():
        _params_log(run, param_pairs)
        _tags_set(run, tag_pairs)
        if not points:
            return 0
        digest = hashlib.sha256(json.dumps([run.pk, points], sort_keys=True, default=str).encode()).hexdigest()
        fresh = _new_points(run, points)
        if not fresh:
            return 0
        return metrics_ingest(
            actor=actor, run=run, points=fresh, idempotency_key=f"mlflow:{digest}", timestamps_ms=True
        ).stored


def tag_delete(*, actor, run: Run, key: str) -> None:
    """Remove tag ``key`` from ``run``; RESOURCE_DOES_NOT_EXIST (404) when it is not set (MLflow's rule)."""
    policy.require_run_writer(actor, run)
    deleted, _ = RunTag.objects.filter(run=run, key=key).delete()
    if not deleted:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No tag with name: {key} in run with id {run.external_id}")
