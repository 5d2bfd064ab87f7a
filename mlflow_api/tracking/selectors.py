"""Reads for the MLflow API, scoped to the user's Projects (invisible → RESOURCE_DOES_NOT_EXIST, 404)."""

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from mlflow_api.errors import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, MlflowError
from mlflow_api.tracking import search
from mlflow_api.tracking.translate import decode_page_token, encode_page_token, metric_json, run_json
from runs.models import DatasetVersion, LoggedModel, MetricPoint, Project, Run, RunTag
from runs.selectors import metric_history

CONTEXT_TAG = "mlflow.data.context"


def experiment_get(*, user, experiment_id) -> Project:
    """The Project whose id is ``experiment_id`` (a string of digits) if the user is a member; else 404."""
    try:
        pk = int(str(experiment_id))
    except ValueError:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No Experiment with id={experiment_id} exists") from None
    project = Project.objects.visible_to(user).filter(pk=pk).first()
    if project is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No Experiment with id={experiment_id} exists")
    return project


def experiment_get_by_name(*, user, name: str) -> Project:
    """The user's Project named ``name`` (or with that slug); else 404 (the client then creates it)."""
    projects = Project.objects.visible_to(user)
    project = projects.filter(name=name).order_by("pk").first() or projects.filter(slug=name).first()
    if project is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, "Could not find an experiment with this name among your projects")
    return project


def experiment_search(*, user, max_results: int, page_token, name: str | None = None) -> tuple[list, str | None]:
    """A page of the user's Projects by name; ``(projects, next_page_token or None)``."""
    projects = Project.objects.visible_to(user).order_by("name", "pk")
    if name is not None:
        projects = projects.filter(name=name)
    offset = decode_page_token(page_token)
    page = list(projects[offset : offset + max_results + 1])
    token = encode_page_token(offset + max_results) if len(page) > max_results else None
    return page[:max_results], token


def run_get(*, user, run_id) -> Run:
    """The visible Run whose external id is ``run_id`` (the newest when two Projects share one); else 404."""
    if not isinstance(run_id, str) or not run_id:
        raise MlflowError(INVALID_PARAMETER_VALUE, "Missing value for required parameter 'run_id'.")
    run = (
        Run.objects.visible_to(user)
        .select_related("project", "created_by")
        .filter(external_id=run_id)
        .order_by("-created_at", "-id")
        .first()
    )
    if run is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, "No run with this run_id among your projects")
    return run


def _latest_metrics(run_ids: list[int]) -> dict[int, list[dict]]:
    """The latest point (highest step, then timestamp) of every key of every run, in one query."""
    ranked = (
        MetricPoint.objects.filter(run_id__in=run_ids)
        .at_last_step()
        .annotate(
            rank=Window(
                RowNumber(),
                partition_by=[F("run_id"), F("key")],
                order_by=[F("step").desc(), F("timestamp").desc(), F("id").desc()],
            )
        )
        .filter(rank=1)
        .values_list("run_id", "key", "value", "step", "timestamp")
    )
    latest: dict[int, list[dict]] = {pk: [] for pk in run_ids}
    for run_id, key, value, step, ts in ranked:
        latest[run_id].append(metric_json(key, MetricPoint.from_db_value(value), step, ts))
    return latest


def runs_json(runs: list[Run], *, with_inputs: bool = False) -> list[dict]:
    """MLflow Run objects for ``runs`` (tags and latest metrics fetched in two queries).

    ``with_inputs`` (``runs/get``) adds each Run's dataset inputs (two queries per Run) and the
    logged models it output (one query per Run).
    """
    ids = [run.pk for run in runs]
    tags: dict[int, dict] = {pk: {} for pk in ids}
    for run_id, key, value in RunTag.objects.filter(run_id__in=ids).values_list("run_id", "key", "value"):
        tags[run_id][key] = value
    metrics = _latest_metrics(ids)
    return [
        run_json(
            run,
            tags=tags[run.pk],
            metrics=metrics[run.pk],
            dataset_inputs=dataset_inputs_json(run) if with_inputs else None,
            model_outputs=_model_outputs(run) if with_inputs else None,
        )
        for run in runs
    ]


def _model_outputs(run: Run) -> list[dict]:
    """MLflow ``outputs.model_outputs`` of ``run``: its live logged models and their steps, oldest first."""
    models = LoggedModel.objects.filter(run=run, deleted_at__isnull=True).order_by("created_at", "id")
    return [{"model_id": model_id, "step": step} for model_id, step in models.values_list("model_id", "step")]


VIEW_TYPES = {"": False, "ACTIVE_ONLY": False, "DELETED_ONLY": True, "ALL": None}


def run_search(
    *,
    user,
    experiment_ids: list,
    filter_string: str,
    order_by: list,
    max_results: int,
    page_token,
    view_type: str = "",
) -> tuple[list[Run], str | None]:
    """A page of the user's Runs in ``experiment_ids`` matching the filter (``mlflow_api.tracking.search``).

    ``view_type`` is MLflow's ``run_view_type``: ACTIVE_ONLY (default) leaves
    soft-deleted Runs out, DELETED_ONLY keeps only them, ALL keeps both;
    anything else → INVALID_PARAMETER_VALUE.
    """
    if view_type not in VIEW_TYPES:
        raise MlflowError(INVALID_PARAMETER_VALUE, f"run_view_type must be one of {', '.join(list(VIEW_TYPES)[1:])}")
    if not isinstance(experiment_ids, list) or not experiment_ids:
        raise MlflowError(INVALID_PARAMETER_VALUE, "experiment_ids must be a non-empty list")
    try:
        project_ids = [int(str(e)) for e in experiment_ids]
    except ValueError:
        raise MlflowError(INVALID_PARAMETER_VALUE, "experiment_ids must be experiment ids (digits)") from None
    runs = Run.objects.visible_to(user).filter(project_id__in=project_ids).select_related("project", "created_by")
    if VIEW_TYPES[view_type] is not None:
        runs = runs.filter(deleted_at__isnull=not VIEW_TYPES[view_type])
    runs = search.apply_order(search.apply_filter(runs, filter_string), order_by or [])
    offset = decode_page_token(page_token)
    page = list(runs[offset : offset + max_results + 1])
    token = encode_page_token(offset + max_results) if len(page) > max_results else None
    return page[:max_results], token


def metric_history_page(*, run: Run, key: str, max_results: int, page_token) -> tuple[list[dict], str | None]:
    """A page of ``key``'s points in ``run`` by step (then insertion), as MLflow Metric objects."""
    offset = decode_page_token(page_token)
    rows = metric_history(run=run, key=key, offset=offset, limit=max_results + 1)
    token = encode_page_token(offset + max_results) if len(rows) > max_results else None
    return [metric_json(key, v, s, ts) for s, v, ts in rows[:max_results]], token


def dataset_inputs_json(run: Run) -> list[dict]:
    """MLflow ``inputs.dataset_inputs`` of ``run``: every dataset version it trained on (inputs, then stages)."""
    versions = {v.pk: v for v in run.input_dataset_versions.select_related("dataset")}
    for stage_version in DatasetVersion.objects.filter(data_stages__run=run).select_related("dataset").distinct():
        versions.setdefault(stage_version.pk, stage_version)
    answer = []
    for version in versions.values():
        meta = version.mlflow_dataset or {}
        tags = [{"key": CONTEXT_TAG, "value": meta["context"]}] if meta.get("context") else []
        answer.append(
            {
                "tags": tags,
                "dataset": {
                    "name": version.dataset.name,
                    "digest": version.version,
                    "source": version.uri,
                    "source_type": meta.get("source_type") or "external",
                    "schema": meta.get("schema", ""),
                    "profile": meta.get("profile", ""),
                },
            }
        )
    return answer
