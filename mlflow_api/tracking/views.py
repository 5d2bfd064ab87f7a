"""MLflow REST endpoints: plain Django views (no session, no CSRF), JSON in and out.

Each view authenticates (``mlflow_api.auth``), reads its arguments (JSON
body for POST, query string for GET), calls one selector or service and
answers MLflow's JSON; every error is ``{"error_code", "message"}``, a body over
``MADO_API_MAX_BODY_BYTES`` included (413 ``INVALID_PARAMETER_VALUE``, ``errors.too_large``).
"""

import functools
import json

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from mado.errors import UserError
from mlflow_api.auth import authenticate_request, require_own_project, require_own_run
from mlflow_api.errors import (
    ENDPOINT_NOT_FOUND,
    INVALID_PARAMETER_VALUE,
    MlflowError,
    error_response,
    from_user_error,
    too_large,
)
from mlflow_api.tracking import inputs, selectors, services
from mlflow_api.tracking.translate import experiment_json, int_arg, page_answer, str_arg


def endpoint(*methods, run_token_allowed: bool = False, reads: bool = False):
    """Decorate ``view(request, user, data)``: method check, auth, JSON body, error translation.

    ``run_token_allowed``: the view acts on one Run (found with ``request_run``, which
    refuses another Run's token); other views refuse every Run token. ``reads``: the
    view only reads, even by POST (a search), so a ``read``-scoped token may call it;
    any other POST, PATCH or DELETE needs a token that may write.
    """

    def wrap(view):
        @csrf_exempt
        @functools.wraps(view)
        def handle(request, **kwargs):
            try:
                if request.method not in methods:
                    raise MlflowError(ENDPOINT_NOT_FOUND, f"{request.method} is not allowed on {request.path}")
                writes = request.method != "GET" and not reads
                user = authenticate_request(request, run_token_allowed=run_token_allowed, writes=writes)
                return JsonResponse(view(request, user, _arguments(request), **kwargs))
            except UserError as exc:
                return error_response(from_user_error(exc))
            except MlflowError as exc:
                return error_response(exc)
            except (RequestDataTooBig, TooManyFieldsSent) as exc:  # Django's HTML 400 otherwise
                return error_response(too_large(exc))

        return handle

    return wrap


def _arguments(request) -> dict:
    if request.method == "GET":
        data = {key: values[-1] if len(values) == 1 else values for key, values in request.GET.lists()}
        return data
    if not request.body:
        return {}
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise MlflowError(INVALID_PARAMETER_VALUE, "the request body must be JSON") from None
    if not isinstance(data, dict):
        raise MlflowError(INVALID_PARAMETER_VALUE, "the request body must be a JSON object")
    return data


def _run_id(data: dict) -> str:
    return str_arg(data, "run_id", required=False, max_length=128) or str_arg(data, "run_uuid", max_length=128)


def request_run(request, user, data: dict):
    """The Run the request names (``run_id`` or ``run_uuid``), in the user's Projects and within a Run token's scope."""
    run = selectors.run_get(user=user, run_id=_run_id(data))
    require_own_run(request, run)
    return run


@endpoint("GET", run_token_allowed=True)
def experiment_get_by_name(request, user, data):
    project = selectors.experiment_get_by_name(user=user, name=str_arg(data, "experiment_name", max_length=500))
    require_own_project(request, project)
    return {"experiment": experiment_json(project)}


@endpoint("GET", run_token_allowed=True)
def experiment_get(request, user, data):
    """``experiments/get``; experiment ``0`` is the user's "Default" Project, made on first use."""
    project = services.experiment_for_id(actor=user, experiment_id=str_arg(data, "experiment_id", max_length=40))
    require_own_project(request, project)
    return {"experiment": experiment_json(project)}


@endpoint("POST")
def experiment_set_tag(request, user, data):
    """``experiments/set-experiment-tag`` ``{experiment_id, key, value}``: writers of the Project; ``{}``."""
    project = services.experiment_for_id(actor=user, experiment_id=str_arg(data, "experiment_id", max_length=40))
    services.experiment_tag_set(
        actor=user,
        project=project,
        key=str_arg(data, "key", max_length=250),
        value=str_arg(data, "value", required=False, max_length=5000),
    )
    return {}


@endpoint("POST")
def experiment_delete_tag(request, user, data):
    """``experiments/delete-experiment-tag`` ``{experiment_id, key}``: 404 when the tag is not set; ``{}``."""
    project = services.experiment_for_id(actor=user, experiment_id=str_arg(data, "experiment_id", max_length=40))
    services.experiment_tag_set(actor=user, project=project, key=str_arg(data, "key", max_length=250), value=None)
    return {}


@endpoint("POST")
def experiment_create(request, user, data):
    name = str_arg(data, "name", max_length=200)
    location = str_arg(data, "artifact_location", required=False, max_length=2000)
    project = services.experiment_create(actor=user, name=name, artifact_location=location)
    return {"experiment_id": str(project.pk)}


@endpoint("POST", "GET", reads=True)
def experiment_search(request, user, data):
    name = None
    flt = str_arg(data, "filter", required=False, max_length=1000).strip()
    if flt:
        left, sep, value = flt.partition("=")
        if (
            not sep
            or left.strip().lower() not in ("name", "attribute.name", "attributes.name")
            or value.strip()[:1] not in "'\""
        ):
            raise MlflowError(INVALID_PARAMETER_VALUE, "experiment filter supports only name = '<name>'")
        name = value.strip()[1:-1]
    projects, token = selectors.experiment_search(
        user=user,
        max_results=int_arg(data, "max_results", default=1000, maximum=50000),
        page_token=data.get("page_token"),
        name=name,
    )
    return page_answer("experiments", [experiment_json(p) for p in projects], token)


@endpoint("POST")
def run_create(request, user, data):
    project = services.experiment_for_id(actor=user, experiment_id=str_arg(data, "experiment_id", max_length=40))
    run = services.run_create(
        actor=user,
        project=project,
        run_name=str_arg(data, "run_name", required=False, max_length=200),
        tags=data.get("tags"),
    )
    return {"run": selectors.runs_json([run])[0]}


@endpoint("GET", run_token_allowed=True)
def run_get(request, user, data):
    """``runs/get``: the Run with its data, and its dataset inputs (``inputs.dataset_inputs``)."""
    return {"run": selectors.runs_json([request_run(request, user, data)], with_inputs=True)[0]}


@endpoint("POST", run_token_allowed=True)
def run_log_inputs(request, user, data):
    """``runs/log-inputs`` ``{run_id, datasets: [{tags, dataset}]}``: DatasetVersions and a data stage; ``{}``."""
    inputs.run_log_inputs(actor=user, run=request_run(request, user, data), datasets=data.get("datasets") or [])
    return {}


@endpoint("POST", run_token_allowed=True)
def run_update(request, user, data):
    run = request_run(request, user, data)
    run = services.run_update(
        actor=user,
        run=run,
        status=str_arg(data, "status", required=False, max_length=20) or None,
        run_name=str_arg(data, "run_name", required=False, max_length=200) or None,
    )
    return {"run_info": selectors.runs_json([run])[0]["info"]}


@endpoint("POST", "GET", reads=True)
def run_search(request, user, data):
    experiment_ids = data.get("experiment_ids")
    if isinstance(experiment_ids, str):
        experiment_ids = [experiment_ids]
    order_by = data.get("order_by") or []
    runs, token = selectors.run_search(
        user=user,
        experiment_ids=experiment_ids,
        view_type=str_arg(data, "run_view_type", required=False, max_length=20),
        filter_string=str_arg(data, "filter", required=False, max_length=4000),
        order_by=[order_by] if isinstance(order_by, str) else order_by,
        max_results=int_arg(data, "max_results", default=1000, maximum=50000),
        page_token=data.get("page_token"),
    )
    return page_answer("runs", selectors.runs_json(runs), token)


@endpoint("POST", run_token_allowed=True)
def run_log_batch(request, user, data):
    run = request_run(request, user, data)
    services.log_batch(
        actor=user, run=run, metrics=data.get("metrics"), params=data.get("params"), tags=data.get("tags")
    )
    return {}


@endpoint("POST", run_token_allowed=True)
def run_log_metric(request, user, data):
    run = request_run(request, user, data)
    metric = {name: data.get(name) for name in ("key", "value", "timestamp", "step")}
    services.log_batch(actor=user, run=run, metrics=[metric])
    return {}


@endpoint("POST", run_token_allowed=True)
def run_log_parameter(request, user, data):
    run = request_run(request, user, data)
    services.log_batch(actor=user, run=run, params=[{"key": data.get("key"), "value": data.get("value")}])
    return {}


@endpoint("POST", run_token_allowed=True)
def run_set_tag(request, user, data):
    run = request_run(request, user, data)
    services.log_batch(actor=user, run=run, tags=[{"key": data.get("key"), "value": data.get("value")}])
    return {}


@endpoint("POST", run_token_allowed=True)
def run_delete_tag(request, user, data):
    run = request_run(request, user, data)
    services.tag_delete(actor=user, run=run, key=str_arg(data, "key", max_length=250))
    return {}


@endpoint("POST", run_token_allowed=True)
def run_delete(request, user, data):
    """``runs/delete`` ``{run_id}``: soft delete (restorable), writers of the Run; ``{}``."""
    services.run_delete(actor=user, run=request_run(request, user, data), deleted=True)
    return {}


@endpoint("POST", run_token_allowed=True)
def run_restore(request, user, data):
    """``runs/restore`` ``{run_id}``: undo a soft delete, writers of the Run; ``{}``."""
    services.run_delete(actor=user, run=request_run(request, user, data), deleted=False)
    return {}


@endpoint("POST")
def refused(request, user, data):
    """Deleting or restoring experiments: mado keeps Projects (their Runs, checkpoints and Jobs)."""
    raise MlflowError(INVALID_PARAMETER_VALUE, "mado does not delete or restore experiments through the MLflow API")


@endpoint("GET", run_token_allowed=True)
def metric_history(request, user, data):
    run = request_run(request, user, data)
    metrics, token = selectors.metric_history_page(
        run=run,
        key=str_arg(data, "metric_key", max_length=250),
        max_results=int_arg(data, "max_results", default=25000, maximum=25000),
        page_token=data.get("page_token"),
    )
    return page_answer("metrics", metrics, token)


@csrf_exempt
def not_found(request, rest=""):
    """Any other MLflow path (``server-info`` included): a JSON 404 the client understands."""
    return error_response(MlflowError(ENDPOINT_NOT_FOUND, f"mado does not implement {request.path}"))
