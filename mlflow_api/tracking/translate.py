"""mado objects ↔ MLflow JSON shapes (timestamps in ms, statuses, NaN as strings, page tokens)."""

import base64
import binascii
import json
import math

from mlflow_api.errors import INVALID_PARAMETER_VALUE, MlflowError
from runs.models import Project, Run, RunStatus

TO_MLFLOW_STATUS = {
    RunStatus.PENDING: "SCHEDULED",
    RunStatus.RUNNING: "RUNNING",
    RunStatus.PREEMPTING: "RUNNING",
    RunStatus.FINISHED: "FINISHED",
    RunStatus.FAILED: "FAILED",
    RunStatus.CRASHED: "FAILED",
    RunStatus.ABORTED: "KILLED",
    RunStatus.PREEMPTED: "KILLED",
}
FROM_MLFLOW_STATUS = {
    "SCHEDULED": RunStatus.PENDING,
    "RUNNING": RunStatus.RUNNING,
    "FINISHED": RunStatus.FINISHED,
    "FAILED": RunStatus.FAILED,
    "KILLED": RunStatus.ABORTED,
}
RUN_NAME_TAG = "mlflow.runName"
KIND_TAG = "mado.kind"


def mado_statuses(mlflow_status: str) -> list[str]:
    """The mado states an MLflow status name covers (``FAILED`` → failed, crashed); 400 for an unknown name."""
    statuses = [mado for mado, name in TO_MLFLOW_STATUS.items() if name == str(mlflow_status).upper()]
    if not statuses:
        raise MlflowError(INVALID_PARAMETER_VALUE, f"unknown run status {mlflow_status!r}")
    return statuses


def ms(moment) -> int | None:
    """A datetime as Unix milliseconds (None stays None)."""
    return None if moment is None else int(moment.timestamp() * 1000)


def encode_value(value: float):
    """A metric value for JSON: NaN and ±Infinity as MLflow's strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def artifact_uri(run: Run) -> str:
    """Where the client sends the run's artifacts: mado's artifact proxy (``/api/2.0/mlflow-artifacts/``)."""
    return f"mlflow-artifacts:/{run.project_id}/{run.external_id}/artifacts"


def experiment_json(project: Project) -> dict:
    """An MLflow Experiment for a Project (``experiment_id`` = the Project's id as a string)."""
    created = ms(project.created_at)
    return {
        "experiment_id": str(project.pk),
        "name": project.name,
        "artifact_location": f"mlflow-artifacts:/{project.pk}",
        "lifecycle_stage": "active",
        "creation_time": created,
        "last_update_time": created,
        "tags": [
            {"key": k, "value": v} for k, v in sorted({**(project.tags or {}), "mado.project": project.slug}.items())
        ],
    }


def metric_json(key: str, value: float, step: int, timestamp: int) -> dict:
    return {"key": key, "value": encode_value(value), "timestamp": timestamp, "step": step}


def run_json(
    run: Run,
    *,
    tags: dict,
    metrics: list[dict],
    dataset_inputs: list[dict] | None = None,
    model_outputs: list[dict] | None = None,
) -> dict:
    """An MLflow Run: ``info`` (``run_id`` = ``run_uuid`` = external id), ``data`` (metrics, params, tags),
    ``inputs`` (dataset inputs) and ``outputs`` (logged models ``[{model_id, step}]``) when given."""
    tags = {**tags, RUN_NAME_TAG: run.name, KIND_TAG: run.kind}
    return {
        "info": {
            "run_id": run.external_id,
            "run_uuid": run.external_id,
            "run_name": run.name,
            "experiment_id": str(run.project_id),
            "user_id": run.created_by.username,
            "status": TO_MLFLOW_STATUS.get(run.status, "RUNNING"),
            "start_time": ms(run.started_at or run.created_at),
            "end_time": ms(run.ended_at),
            "artifact_uri": artifact_uri(run),
            "lifecycle_stage": "deleted" if run.deleted_at else "active",
        },
        "data": {
            "metrics": metrics,
            "params": [{"key": str(k), "value": _param_str(v)} for k, v in sorted(run.parameters.items())],
            "tags": [{"key": k, "value": v} for k, v in sorted(tags.items())],
        },
        "inputs": {"dataset_inputs": dataset_inputs} if dataset_inputs else {},
        "outputs": {"model_outputs": model_outputs} if model_outputs else {},
    }


def _param_str(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def param_str(value) -> str:
    """A stored parameter as MLflow's string (non-strings from the native SDK as JSON)."""
    return _param_str(value)


def page_answer(name: str, items: list, token: str | None) -> dict:
    """A page of an MLflow list answer: ``{name: items}`` plus ``next_page_token`` when there is a next page."""
    return {name: items, **({"next_page_token": token} if token else {})}


def encode_page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def decode_page_token(token) -> int:
    """The offset a page token stands for; 400 INVALID_PARAMETER_VALUE for a forged or broken one."""
    if not token:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(str(token).encode()))["offset"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise MlflowError(INVALID_PARAMETER_VALUE, "invalid page_token") from None
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise MlflowError(INVALID_PARAMETER_VALUE, "invalid page_token")
    return offset


def int_arg(data: dict, name: str, *, default: int, maximum: int, minimum: int = 1) -> int:
    """An integer request field (JSON number or query-string digits) within bounds; 400 naming it otherwise."""
    raw = data.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise MlflowError(INVALID_PARAMETER_VALUE, f"{name} must be an integer") from None
    if isinstance(raw, bool) or not minimum <= value <= maximum:
        raise MlflowError(INVALID_PARAMETER_VALUE, f"{name} must be between {minimum} and {maximum}")
    return value


def str_arg(data: dict, name: str, *, required: bool = True, max_length: int = 1000) -> str:
    """A string request field; 400 INVALID_PARAMETER_VALUE naming it when missing, not a string, or too long."""
    value = data.get(name)
    if value in (None, ""):
        if required:
            raise MlflowError(INVALID_PARAMETER_VALUE, f"Missing value for required parameter '{name}'.")
        return ""
    if not isinstance(value, str) or len(value) > max_length or "\x00" in value:
        raise MlflowError(INVALID_PARAMETER_VALUE, f"{name} must be a string of at most {max_length} characters")
    return value
