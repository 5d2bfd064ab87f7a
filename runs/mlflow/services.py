"""State changes through the MLflow API (issue 7 parts 1 and 5; SPEC F30).

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
  kept by ``run_set_status`` (asking for another final one → 400 INVALID_STATE).
"""

import hashlib
import json
import uuid

from django.db import transaction

from mado import policy
from mado.errors import Conflict, Forbidden
from runs import services as run_services
from runs.metric_batch import parse_value
from runs.metrics import metrics_ingest
from runs.mlflow.errors import INVALID_PARAMETER_VALUE, RESOURCE_ALREADY_EXISTS, MlflowError
from runs.mlflow.translate import FROM_MLFLOW_STATUS, KIND_TAG, RUN_NAME_TAG, param_str
from runs.models import MetricPoint, Project, Run, RunKind, RunTag

MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100
KEY_MAX, PARAM_VALUE_MAX, TAG_VALUE_MAX = 250, 6000, 8000


def _bad(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def _require_member(actor, project: Project) -> None:
    if not policy.can_write_runs(actor, project):
        raise Forbidden(policy.why_not(actor, project, policy.MEMBER) or "not allowed")


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


def _key_values(items, name: str, limit: int, value_max: int) -> list[tuple[str, str]]:
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
    with that sentence instead of silently returning None; F31).
    """
    if artifact_location:
        raise _bad("artifact_location is chosen by mado and must be empty")
    if Project.objects.visible_to(actor).filter(name=name.strip()).exists():
        raise MlflowError(RESOURCE_ALREADY_EXISTS, f"Experiment '{name}' already exists.")
    try:
        return run_services.project_create(user=actor, name=name)
    except Conflict as exc:
        raise _bad("this experiment name cannot be used: choose another name") from None


@transaction.atomic
def run_create(*, actor, project: Project, run_name: str = "", tags=None) -> Run:
    """Create a running Run in ``project`` with a 32-hex run id (MLflow's form).

    ``tags`` is MLflow's ``[{key, value}]``: ``mado.kind`` sets the kind
    (default training; 400 for an unknown kind), ``mlflow.runName`` the name
    (``run_name`` wins), the rest are stored as RunTags.
    """
    _require_member(actor, project)
    tag_map = dict(_key_values(tags, "tags", MAX_TAGS, TAG_VALUE_MAX))
    kind = tag_map.pop(KIND_TAG, RunKind.TRAINING)
    if kind not in RunKind.values:
        raise _bad(f"tag {KIND_TAG} must be one of {', '.join(RunKind.values)}")
    name = run_name or tag_map.pop(RUN_NAME_TAG, "")
    tag_map.pop(RUN_NAME_TAG, None)
    run = run_services.run_create(actor=actor, project=project, name=name, kind=kind, external_id=uuid.uuid4().hex)
    RunTag.objects.bulk_create([RunTag(run=run, key=k, value=v) for k, v in tag_map.items()])
    return run


def run_update(*, actor, run: Run, status: str | None = None, run_name: str | None = None) -> Run:
    """Change a Run's status (MLflow name) and/or name. A final status is kept: another final → INVALID_STATE."""
    policy.require_run_writer(actor, run)
    if run_name:
        Run.objects.filter(pk=run.pk).update(name=run_name[:200])
        run.name = run_name[:200]
    if status:
        if str(status).upper() not in FROM_MLFLOW_STATUS:
            raise _bad(f"status must be one of {', '.join(FROM_MLFLOW_STATUS)}")
        run = run_services.run_set_status(actor=actor, run=run, status=FROM_MLFLOW_STATUS[str(status).upper()])
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
                f"value='{param_str(merged[key])}' for run ID='{run.external_id}'. Attempted logging new value '{value}'."
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
        points.append({
            "key": metric.get("key"), "value": metric.get("value"),
            "step": int64(metric.get("step"), f"metrics[{index}].step", default=0),
            "timestamp": int64(metric.get("timestamp"), f"metrics[{index}].timestamp"),
        })
    return points


def _new_points(run: Run, points: list[dict]) -> list[dict]:
    """``points`` without those already stored or repeated in the batch, on (key, step, timestamp, value)."""
    def identity(p):
        return (p["key"], p["step"], p["timestamp"], MetricPoint.to_db_value(parse_value(p["value"], "value")))

    valid = [p for p in points if isinstance(p["key"], str) and isinstance(p["timestamp"], int) and p["value"] is not None]
    if len(valid) != len(points):
        return points  # let metrics_ingest name the bad field
    seen = set(MetricPoint.objects.filter(
        run=run, key__in={p["key"] for p in points},
        step__gte=min(p["step"] for p in points), step__lte=max(p["step"] for p in points),
    ).values_list("key", "step", "timestamp", "value"))
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
    are skipped, see the module docstring). Forbidden (403) unless the actor may write to the Run (F31);
    400 INVALID_PARAMETER_VALUE naming the first bad field.
    """
    policy.require_run_writer(actor, run)
    param_pairs = _key_values(params, "params", MAX_PARAMS, PARAM_VALUE_MAX)
    tag_pairs = _key_values(tags, "tags", MAX_TAGS, TAG_VALUE_MAX)
    points = _points(metrics)
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
    from runs.mlflow.errors import RESOURCE_DOES_NOT_EXIST

    policy.require_run_writer(actor, run)
    deleted, _ = RunTag.objects.filter(run=run, key=key).delete()
    if not deleted:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No tag with name: {key} in run with id {run.external_id}")
