"""MLflow 3 logged models: ``logged-models`` create, get, finalize, tags, params, delete, search
(docs/design/interfaces.md#mlflow).

A logged model (``runs.models.LoggedModel``) belongs to an experiment
(Project), links to the Run that logged it (``source_run_id``) and the step it
was logged at (``runs/outputs``), and keeps its files as Artifacts under
``artifact_uri`` = ``mlflow-artifacts:/<experiment_id>/models/<model_id>/artifacts``
(the artifact proxy streams them). Its metrics are its Run's points at that
step. Errors are MLflow's: an unknown or invisible model is
RESOURCE_DOES_NOT_EXIST (404) "Logged model with ID '…' not found.", bad input
INVALID_PARAMETER_VALUE (400) naming the field.
"""

import json
import secrets
import uuid
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from mado import policy
from mlflow_api.artifacts.checkpoint_files import checkpoint_files_finish_for_model
from mlflow_api.errors import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, MlflowError
from mlflow_api.tracking import search
from mlflow_api.tracking.services import (
    MAX_PARAMS,
    MAX_TAGS,
    PARAM_VALUE_MAX,
    TAG_VALUE_MAX,
    int64,
    key_values,
)
from mlflow_api.tracking.translate import decode_page_token, encode_page_token, metric_json, ms
from runs.models import LoggedModel, LoggedModelStatus, MetricPoint, Project, Run, RunTag

NAME_MAX = 250
BAD_NAME_CHARS = ("/", ":", ".", "%", '"', "'")  # MLflow's rule: the name is a path segment of the model's URI
STATUS_NAMES = {
    LoggedModelStatus.PENDING: "LOGGED_MODEL_PENDING",
    LoggedModelStatus.READY: "LOGGED_MODEL_READY",
    LoggedModelStatus.UPLOAD_FAILED: "LOGGED_MODEL_UPLOAD_FAILED",
}
# What a request may name a status by: protobuf's enum name or number, or the short name a filter uses.
STATUS_VALUES = {
    **{name: status for status, name in STATUS_NAMES.items()},
    **{name.removeprefix("LOGGED_MODEL_"): status for status, name in STATUS_NAMES.items()},
    1: LoggedModelStatus.PENDING,
    2: LoggedModelStatus.READY,
    3: LoggedModelStatus.UPLOAD_FAILED,
}
_ATTRIBUTES = {
    "name": "name",
    "model_id": "model_id",
    "model_type": "model_type",
    "source_run_id": "run__external_id",
    "status": "status",
}
_TIMES = {
    "creation_time": "created_at",
    "creation_timestamp": "created_at",
    "creation_timestamp_ms": "created_at",
    "last_updated_timestamp": "updated_at",
    "last_updated_timestamp_ms": "updated_at",
}
_ORDER_FIELDS = {**_TIMES, "name": "name", "model_id": "model_id", "model_type": "model_type", "status": "status"}
SEARCH_DEFAULT, SEARCH_MAX = 100, 1000
MODEL_VERSIONS_TAG = "mlflow.modelVersions"  # the registry versions made from a model, written by the client


def _bad(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def _not_found(model_id: str) -> MlflowError:
    return MlflowError(RESOURCE_DOES_NOT_EXIST, f"Logged model with ID {model_id!r} not found.")


def status_of(value) -> str:
    """A ``LoggedModelStatus`` from a request's status (``LOGGED_MODEL_READY``, ``READY``, 2…); 400 otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value not in STATUS_VALUES:
        if value in (None, ""):
            raise _bad("Missing value for required parameter 'status'.")
        raise _bad(f"status must be one of {', '.join(STATUS_NAMES.values())}")
    return STATUS_VALUES[value]


def check_name(name) -> str:
    """A logged model's name: MLflow's rule (non-empty, none of ``/ : . % " '``), at most 250 characters, no control
    characters."""
    if not isinstance(name, str) or not name or any(char in name for char in BAD_NAME_CHARS):
        raise _bad(
            f"Invalid model name ({name!r}) provided. Model name must be a non-empty string and cannot "
            f"contain the following characters: {BAD_NAME_CHARS}"
        )
    if len(name) > NAME_MAX or any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise _bad(f"name must be at most {NAME_MAX} characters without control characters")
    return name


def _pairs(items, name: str, limit: int, value_max: int) -> dict[str, str]:
    return dict(key_values(items, name, limit, value_max))


def logged_model_create(
    *,
    actor,
    project: Project,
    name: str = "",
    model_type: str = "",
    source_run: Run | None = None,
    params=None,
    tags=None,
) -> LoggedModel:
    """A new PENDING logged model in ``project`` (``logged-models`` create).

    Members of the Project (``Forbidden``); ``source_run`` (None: logged
    outside a run) must be a Run of ``project`` the actor may write (400
    INVALID_PARAMETER_VALUE, ``Forbidden``). ``name`` empty: a random
    ``model-<hex>`` name (MLflow also picks one). ``params`` and ``tags`` are
    MLflow's ``[{key, value}]`` lists (at most 100 each; 400 naming the bad item).
    """
    policy.require_role(actor, project, policy.MEMBER)
    if source_run is not None:
        if source_run.project_id != project.pk:
            raise _bad(f"source_run_id {source_run.external_id} is a run of another experiment than {project.pk}")
        policy.require_run_writer(actor, source_run)
    name = check_name(name) if name else f"model-{secrets.token_hex(4)}"
    if not isinstance(model_type, str) or len(model_type) > NAME_MAX:
        raise _bad(f"model_type must be a string of at most {NAME_MAX} characters")
    return LoggedModel.objects.create(
        project=project,
        run=source_run,
        model_id=f"m-{uuid.uuid4().hex}",
        name=name,
        model_type=model_type,
        params=_pairs(params, "params", MAX_PARAMS, PARAM_VALUE_MAX),
        tags=_pairs(tags, "tags", MAX_TAGS, TAG_VALUE_MAX),
        created_by=actor,
    )


def logged_model_get(*, user, model_id, allow_deleted: bool = False) -> LoggedModel:
    """The logged model ``model_id`` in one of the user's Projects (deleted ones only with ``allow_deleted``); else
    404."""
    if not isinstance(model_id, str) or not model_id or len(model_id) > 40 or "\x00" in model_id:
        raise _not_found(str(model_id)[:40].replace("\x00", ""))
    models = LoggedModel.objects.visible_to(user).select_related("project", "run", "created_by")
    model = models.filter(model_id=model_id).first()
    if model is None or (model.deleted_at is not None and not allow_deleted):
        raise _not_found(model_id)
    return model


def _locked(model: LoggedModel) -> LoggedModel:
    return LoggedModel.objects.select_for_update(of=("self",)).select_related("project", "run").get(pk=model.pk)


@transaction.atomic
def logged_model_finalize(*, actor, model: LoggedModel, status) -> LoggedModel:
    """Set the model's status (``LOGGED_MODEL_READY`` or ``LOGGED_MODEL_UPLOAD_FAILED``); its writers
    (``Forbidden``).

    READY completes the checkpoint the model's files joined (a Hugging Face
    ``checkpoint-N``), UPLOAD_FAILED ends it ``error``
    (docs/design/checkpoints.md#mlflow-checkpoints).
    """
    policy.require_logged_model_writer(actor, model)
    new_status = status_of(status)
    if new_status != LoggedModelStatus.PENDING:  # the Run's lock before the model's
        checkpoint_files_finish_for_model(model=model, ready=new_status == LoggedModelStatus.READY)
    model = _locked(model)
    model.status = new_status
    model.save(update_fields=["status", "updated_at"])
    return model


@transaction.atomic
def logged_model_set_tags(*, actor, model: LoggedModel, tags) -> LoggedModel:
    """Set (replace) the tags ``[{key, value}]`` on the model; its writers (``Forbidden``); 400 naming a bad tag.

    The one tag ``mlflow.modelVersions`` alone may also be set by any member of the model's Project: the client
    records there the registry versions made from the model, and any member registers (docs/api.md#model-registry).
    """
    pairs = _pairs(tags, "tags", MAX_TAGS, TAG_VALUE_MAX)
    if set(pairs) == {MODEL_VERSIONS_TAG}:
        policy.require_role(actor, model.project, policy.MEMBER)
    else:
        policy.require_logged_model_writer(actor, model)
    model = _locked(model)
    model.tags = {**model.tags, **pairs}
    model.save(update_fields=["tags", "updated_at"])
    return model


@transaction.atomic
def logged_model_delete_tag(*, actor, model: LoggedModel, key: str) -> None:
    """Remove tag ``key``; RESOURCE_DOES_NOT_EXIST (404) when it is not set, as on MLflow; its writers
    (``Forbidden``)."""
    policy.require_logged_model_writer(actor, model)
    model = _locked(model)
    if key not in model.tags:
        raise MlflowError(
            RESOURCE_DOES_NOT_EXIST, f"No tag with key {key!r} found for model with ID {model.model_id!r}."
        )
    del model.tags[key]
    model.save(update_fields=["tags", "updated_at"])


@transaction.atomic
def logged_model_log_params(*, actor, model: LoggedModel, params) -> None:
    """Add params ``[{key, value}]``: the same value again is a no-op, another value 400 (a param never changes)."""
    policy.require_logged_model_writer(actor, model)
    pairs = _pairs(params, "params", MAX_PARAMS, PARAM_VALUE_MAX)
    model = _locked(model)
    for key, value in pairs.items():
        if model.params.get(key, value) != value:
            raise _bad(
                f"Changing param values is not allowed. Param with key={key!r} was already logged with "
                f"value={model.params[key]!r} for model ID={model.model_id!r}."
            )
    model.params = {**model.params, **pairs}
    model.save(update_fields=["params", "updated_at"])


def logged_model_delete(*, actor, model: LoggedModel) -> None:
    """Soft-delete the model (MLflow's ``delete_logged_model``): gone from get and search, files kept; idempotent."""
    policy.require_logged_model_writer(actor, model)
    LoggedModel.objects.filter(pk=model.pk, deleted_at__isnull=True).update(
        deleted_at=timezone.now(), updated_at=timezone.now()
    )


@transaction.atomic
def run_log_outputs(*, actor, run: Run, outputs) -> None:
    """``runs/outputs`` ``[{model_id, step}]``: link each logged model to ``run`` and the step it was logged at.

    The Run's writers (``Forbidden``). Each model must be visible (404) and
    in the Run's experiment; a model logged by another Run keeps that link
    (400: mado links a model to one Run).
    """
    policy.require_run_writer(actor, run)
    if not isinstance(outputs, list) or not outputs or len(outputs) > MAX_PARAMS:
        raise _bad(f"models must be a non-empty list of at most {MAX_PARAMS} {{model_id, step}} objects")
    for index, output in enumerate(outputs):
        if not isinstance(output, dict):
            raise _bad(f"models[{index}] must be an object")
        step = int64(output.get("step"), f"models[{index}].step", default=0)
        model = _locked(logged_model_get(user=actor, model_id=output.get("model_id")))
        if model.project_id != run.project_id or model.run_id not in (None, run.pk):
            raise _bad(f"models[{index}]: model {model.model_id} was logged by another run or experiment")
        model.run, model.step = run, step
        model.save(update_fields=["run", "step", "updated_at"])


def _metrics(models: list[LoggedModel]) -> dict[int, list[dict]]:
    """Every model's metrics: its Run's points at its step (one query for the page)."""
    linked = [m for m in models if m.run_id is not None]
    found: dict[int, list[dict]] = {m.pk: [] for m in models}
    if not linked:
        return found
    where = Q()
    for model in linked:
        where |= Q(
            run_id=model.run_id, step=model.step, chunk_first_step__lte=model.step, chunk_last_step__gte=model.step
        )
    by_run_step: dict[tuple[int, int], list] = {}
    for row in (
        MetricPoint.objects.filter(where)
        .order_by("key", "timestamp", "id")
        .values_list("run_id", "step", "key", "value", "timestamp")
    ):
        by_run_step.setdefault(row[:2], []).append(row[2:])
    for model in linked:
        for key, value, timestamp in by_run_step.get((model.run_id, model.step), []):
            point = metric_json(key, MetricPoint.from_db_value(value), model.step, timestamp)
            found[model.pk].append({**point, "run_id": model.run.external_id, "model_id": model.model_id})
    return found


def artifact_uri(model: LoggedModel) -> str:
    """Where the client puts and gets the model's files: mado's artifact proxy."""
    return f"mlflow-artifacts:/{model.project_id}/models/{model.model_id}/artifacts"


def models_json(models: list[LoggedModel]) -> list[dict]:
    """MLflow ``LoggedModel`` objects (``info``, ``data``) for ``models`` (their Runs selected)."""
    metrics = _metrics(models)
    return [
        {
            "info": {
                "model_id": m.model_id,
                "experiment_id": str(m.project_id),
                "name": m.name,
                "creation_timestamp_ms": ms(m.created_at),
                "last_updated_timestamp_ms": ms(m.updated_at),
                "artifact_uri": artifact_uri(m),
                "status": STATUS_NAMES[m.status],
                "creator_id": m.created_by_id,
                "model_type": m.model_type,
                "status_message": m.status_message,
                "tags": [{"key": k, "value": v} for k, v in sorted(m.tags.items())],
                # MLflow leaves the field out when there is no source run (the client reads None)
                **({"source_run_id": m.run.external_id} if m.run else {}),
            },
            "data": {
                "params": [{"key": k, "value": v} for k, v in sorted(m.params.items())],
                "metrics": metrics[m.pk],
            },
        }
        for m in models
    ]


def _filter(models, filter_string: str):
    for index, entity, key, op, raw in search.clauses(filter_string):
        kind = (entity or "attributes").lower()
        if kind in ("attributes", "attribute", "attr") and key in _TIMES:
            if op not in search.NUMBER_OPS:
                raise _bad(f"{key} compares with =, <, <=, >, >=; got {op}")
            moment = datetime.fromtimestamp(search.number_value(raw) / 1000, tz=UTC)
            models = models.filter(**{f"{_TIMES[key]}__{search.NUMBER_OPS[op]}": moment})
            continue
        if op not in search.STRING_OPS:
            raise _bad(f"{key!r} compares with =, !=, LIKE, ILIKE; got {op}")
        value = search.string_value(raw)
        if kind in ("attributes", "attribute", "attr") and key in _ATTRIBUTES:
            field = _ATTRIBUTES[key]
            if key == "status":
                value = status_of(value.upper())
        elif kind in ("tags", "tag", "params", "param"):
            field = f"_f{index}"
            models = models.annotate(**{field: search.json_text("tags" if kind.startswith("tag") else "params", key)})
        else:
            raise _bad(
                f"unsupported filter on {entity + '.' if entity else ''}{key}: use name, model_id, model_type, "
                "status, source_run_id, creation_time, last_updated_timestamp, tags.<key> or params.<key>"
            )
        models = models.filter(search.string_q(field, op, value))
    return models


def _ordering(order_by) -> list:
    if order_by in (None, ""):
        return [F("created_at").desc(), F("id").desc()]
    if not isinstance(order_by, list):
        raise _bad("order_by must be a list of {field_name, ascending} objects")
    ordering = []
    for index, clause in enumerate(order_by):
        field = clause.get("field_name") if isinstance(clause, dict) else None
        if field not in _ORDER_FIELDS:
            raise _bad(
                f"Invalid order by field name: {field}"
                if isinstance(field, str)
                else f"order_by[{index}].field_name must be one of {', '.join(_ORDER_FIELDS)}"
            )
        column = F(_ORDER_FIELDS[field])
        ordering.append(column.asc() if clause.get("ascending", True) is not False else column.desc())
    return [*ordering, F("created_at").desc(), F("id").desc()]


def logged_model_search(
    *, user, experiment_ids, filter_string: str = "", order_by=None, max_results=None, page_token=None, datasets=None
) -> tuple[list[LoggedModel], str | None]:
    """A page of the user's live logged models in ``experiment_ids``; ``(models, next_page_token or None)``.

    ``experiment_ids``: a non-empty list of experiment ids (``"0"`` is the
    user's Default experiment); ``filter_string``: clauses on name,
    model_id, model_type, status, source_run_id (strings: =, !=, LIKE,
    ILIKE), creation_time / last_updated_timestamp (ms: =, <, <=, >, >=),
    tags.<key>, params.<key>, joined by AND; ``order_by``: ``[{field_name,
    ascending}]`` on those attributes (default newest first);
    ``max_results`` 1..1000 (default 100). Metric filters and ``datasets``
    are not supported (400 INVALID_PARAMETER_VALUE), nor is anything else
    unknown.
    """
    if (
        not isinstance(experiment_ids, list)
        or not experiment_ids
        or not all(isinstance(e, str) for e in experiment_ids)
    ):
        raise _bad("experiment_ids must be a non-empty list of experiment ids")
    if datasets:
        raise _bad("datasets: mado does not filter logged models by dataset")
    project_ids = {int(e) for e in experiment_ids if e.isdigit() and e != "0"}
    default = Q(project__default_for=user) if "0" in experiment_ids else Q(pk__in=[])
    models = (
        LoggedModel.objects.visible_to(user)
        .filter(Q(project_id__in=project_ids) | default)
        .filter(deleted_at__isnull=True)
        .select_related("run")
    )
    models = _filter(models, filter_string if isinstance(filter_string, str) else "").order_by(*_ordering(order_by))
    size = int64(max_results, "max_results", default=SEARCH_DEFAULT)
    if not 1 <= size <= SEARCH_MAX:
        raise _bad(f"max_results must be between 1 and {SEARCH_MAX}")
    offset = decode_page_token(page_token)
    page = list(models[offset : offset + size + 1])
    token = encode_page_token(offset + size) if len(page) > size else None
    return page[:size], token


LOG_MODEL_HISTORY_TAG = "mlflow.log-model.history"
MODEL_JSON_MAX = 65536


@transaction.atomic
def run_record_model(*, actor, run: Run, model_json) -> None:
    """``runs/log-model`` ``{run_id, model_json}``: append the model's metadata to the Run's
    ``mlflow.log-model.history`` tag (a JSON list), as an MLflow server does. The Run's writers
    (``Forbidden``); ``model_json`` must be a JSON object of at most 64 KiB (400 otherwise).
    """
    policy.require_run_writer(actor, run)
    try:
        entry = json.loads(model_json) if isinstance(model_json, str) and len(model_json) <= MODEL_JSON_MAX else None
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        raise _bad(f"model_json must be a JSON object of at most {MODEL_JSON_MAX} characters")
    Run.objects.select_for_update().filter(pk=run.pk).first()  # one appender at a time
    tag = RunTag.objects.filter(run=run, key=LOG_MODEL_HISTORY_TAG).first()
    try:
        history = json.loads(tag.value) if tag else []
    except ValueError:
        history = []
    history = [*(history if isinstance(history, list) else []), entry]
    RunTag.objects.update_or_create(run=run, key=LOG_MODEL_HISTORY_TAG, defaults={"value": json.dumps(history)})
