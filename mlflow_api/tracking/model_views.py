"""MLflow 3 logged-model endpoints ``api/2.0/mlflow/logged-models…`` and ``runs/outputs`` / ``runs/log-model``
(docs/design/interfaces.md#mlflow).

Same decorator, authentication and error shape as ``mlflow_api.tracking.views``
(the listing of a model's files, ``logged-models/<id>/artifacts/directories``,
is ``mlflow_api.artifacts.model_files``: it reads Artifacts). A
Job's Run token reaches the logged models its own Run produced, creates
models only with its Run as ``source_run_id``, and searches only its Run's
experiment; a model logged outside a run is out of every Run token's reach.
"""

from mado.authentication import RUN_TOKEN_SCOPE
from mlflow_api.auth import require_own_project, require_own_run, token_run
from mlflow_api.errors import PERMISSION_DENIED, MlflowError
from mlflow_api.tracking import logged_models, services
from mlflow_api.tracking.translate import page_answer, str_arg
from mlflow_api.tracking.views import endpoint, request_run
from runs.models import LoggedModel


def request_model(request, user, model_id: str, *, allow_deleted: bool = False) -> LoggedModel:
    """The logged model ``model_id`` (404 when invisible); 403 for a Run token of another Run than its source Run."""
    model = logged_models.logged_model_get(user=user, model_id=model_id, allow_deleted=allow_deleted)
    require_own_run(request, model.run)
    return model


def _one(model: LoggedModel) -> dict:
    return {"model": logged_models.models_json([model])[0]}


@endpoint("POST", run_token_allowed=True)
def logged_model_create(request, user, data):
    """``logged-models`` ``{experiment_id, name?, model_type?, source_run_id?, params?, tags?}`` → ``{"model"}``.

    A PENDING model; ``experiment_id`` ``"0"`` is the user's Default
    experiment; ``source_run_id`` a Run of that experiment the caller may write.
    """
    source = None
    if str_arg(data, "source_run_id", required=False, max_length=128):
        source = request_run(request, user, {"run_id": data["source_run_id"]})
    elif token_run(request) is not None:
        raise MlflowError(PERMISSION_DENIED, f"{RUN_TOKEN_SCOPE}: set source_run_id to the token's run")
    project = services.experiment_for_id(actor=user, experiment_id=str_arg(data, "experiment_id", max_length=40))
    require_own_project(request, project)
    model = logged_models.logged_model_create(
        actor=user,
        project=project,
        name=str_arg(data, "name", required=False, max_length=logged_models.NAME_MAX),
        model_type=str_arg(data, "model_type", required=False, max_length=logged_models.NAME_MAX),
        source_run=source,
        params=data.get("params"),
        tags=data.get("tags"),
    )
    return _one(model)


@endpoint("GET", "PATCH", "DELETE", run_token_allowed=True)
def logged_model_detail(request, user, data, model_id):
    """``logged-models/<model_id>``: GET the model (``?allow_deleted=true`` includes a deleted one);
    PATCH ``{status}`` finalizes it (``LOGGED_MODEL_READY`` / ``LOGGED_MODEL_UPLOAD_FAILED``);
    DELETE soft-deletes it (``{}``). Writes: the model's writers (``policy.why_cannot_write_logged_model``)."""
    if request.method == "GET":
        allow_deleted = str(data.get("allow_deleted", "false")).lower() == "true"
        return _one(request_model(request, user, model_id, allow_deleted=allow_deleted))
    model = request_model(request, user, model_id, allow_deleted=request.method == "DELETE")  # deleting twice: {}
    if request.method == "PATCH":
        return _one(logged_models.logged_model_finalize(actor=user, model=model, status=data.get("status")))
    logged_models.logged_model_delete(actor=user, model=model)
    return {}


@endpoint("PATCH", run_token_allowed=True)
def logged_model_set_tags(request, user, data, model_id):
    """``logged-models/<model_id>/tags`` ``{tags: [{key, value}]}`` → ``{"model"}`` with the tags set."""
    model = logged_models.logged_model_set_tags(
        actor=user, model=request_model(request, user, model_id), tags=data.get("tags")
    )
    return _one(model)


@endpoint("DELETE", run_token_allowed=True)
def logged_model_delete_tag(request, user, data, model_id, tag_key):
    """``logged-models/<model_id>/tags/<key>``: remove the tag (404 when it is not set); ``{}``."""
    logged_models.logged_model_delete_tag(actor=user, model=request_model(request, user, model_id), key=tag_key)
    return {}


@endpoint("POST", run_token_allowed=True)
def logged_model_log_params(request, user, data, model_id):
    """``logged-models/<model_id>/params`` ``{params: [{key, value}]}`` (the client sends params past the first 100);
    ``{}``."""
    logged_models.logged_model_log_params(
        actor=user, model=request_model(request, user, model_id), params=data.get("params")
    )
    return {}


@endpoint("POST", "GET", run_token_allowed=True, reads=True)
def logged_model_search(request, user, data):
    """``logged-models/search`` ``{experiment_ids, filter?, order_by?, max_results?, page_token?}`` →
    ``{"models", "next_page_token"?}`` (grammar: ``logged_models.logged_model_search``); a Run token
    sees only its Run's experiment."""
    experiment_ids = data.get("experiment_ids")
    if isinstance(experiment_ids, str):
        experiment_ids = [experiment_ids]
    scoped = token_run(request)
    if scoped is not None and isinstance(experiment_ids, list):
        experiment_ids = [e for e in experiment_ids if e == str(scoped.project_id)] or ["-"]
    models, token = logged_models.logged_model_search(
        user=user,
        experiment_ids=experiment_ids,
        filter_string=str_arg(data, "filter", required=False, max_length=4000),
        order_by=data.get("order_by"),
        max_results=data.get("max_results"),
        page_token=data.get("page_token"),
        datasets=data.get("datasets"),
    )
    return page_answer("models", logged_models.models_json(models), token)


@endpoint("POST", run_token_allowed=True)
def run_log_outputs(request, user, data):
    """``runs/outputs`` ``{run_id, models: [{model_id, step}]}``: link the models to the Run and step; ``{}``."""
    run = request_run(request, user, data)
    logged_models.run_log_outputs(actor=user, run=run, outputs=data.get("models"))
    return {}


@endpoint("POST", run_token_allowed=True)
def run_log_model(request, user, data):
    """``runs/log-model`` ``{run_id, model_json}``: the Run's ``mlflow.log-model.history`` tag grows by one; ``{}``."""
    logged_models.run_record_model(actor=user, run=request_run(request, user, data), model_json=data.get("model_json"))
    return {}
