"""The MLflow model registry endpoints ``api/2.0/mlflow/registered-models/…`` and ``model-versions/…``
(docs/api.md#model-registry).

Same decorator, authentication and error shape as ``mlflow_api.tracking.views``.
A Job's Run token may only create a model (in its Run's Project) and versions
of what its own Run logged, so ``log_model(registered_model_name=…)`` works in
a Job; every other registry endpoint refuses it (403).
"""

from mado.authentication import RUN_TOKEN_SCOPE
from mlflow_api.auth import require_own_run, token_run
from mlflow_api.errors import INVALID_PARAMETER_VALUE, PERMISSION_DENIED, MlflowError
from mlflow_api.registry import selectors, services
from mlflow_api.registry.selectors import model_version_json, registered_model_json
from mlflow_api.tracking import logged_models
from mlflow_api.tracking import selectors as tracking_selectors
from mlflow_api.tracking.translate import page_answer, str_arg
from mlflow_api.tracking.views import endpoint


def _model(user, data):
    return selectors.registered_model_get(user=user, name=str_arg(data, "name", max_length=250))


def _version(user, data):
    return selectors.model_version_get(
        user=user, name=str_arg(data, "name", max_length=250), version=str_arg(data, "version", max_length=20)
    )


def _in_token_project(scoped, tags) -> list:
    """``tags`` placing the new model in the Run token's Project; naming another one → 403."""
    tags = list(tags) if isinstance(tags, list) else []
    placed = [t.get("value") for t in tags if isinstance(t, dict) and t.get("key") == services.PROJECT_TAG]
    if any(value not in (str(scoped.project_id), scoped.project.slug) for value in placed):
        raise MlflowError(PERMISSION_DENIED, f"{RUN_TOKEN_SCOPE}: a Job registers models in its own run's project")
    return tags if placed else [*tags, {"key": services.PROJECT_TAG, "value": str(scoped.project_id)}]


def _list(value) -> list:
    return [value] if isinstance(value, str) else value or []


@endpoint("POST", run_token_allowed=True)
def registered_model_create(request, user, data):
    """``registered-models/create`` ``{name, tags?, description?}`` → ``{registered_model}``; a Job's Run token
    makes it in its Run's Project (``log_model(registered_model_name=…)`` in a Job)."""
    tags = data.get("tags")
    if token_run(request) is not None:
        tags = _in_token_project(token_run(request), tags)
    model = services.registered_model_create(
        actor=user, name=data.get("name"), tags=tags, description=data.get("description")
    )
    return {"registered_model": registered_model_json(model)}


@endpoint("GET")
def registered_model_get(request, user, data):
    """``registered-models/get?name=`` → ``{registered_model}`` (latest version, aliases)."""
    return {"registered_model": registered_model_json(_model(user, data))}


@endpoint("PATCH")
def registered_model_update(request, user, data):
    """``registered-models/update`` ``{name, description}`` → ``{registered_model}``."""
    model = services.registered_model_update(actor=user, model=_model(user, data), description=data.get("description"))
    return {"registered_model": registered_model_json(model)}


@endpoint("POST")
def registered_model_rename(request, user, data):
    """``registered-models/rename`` ``{name, new_name}`` → ``{registered_model}`` (Project admins)."""
    model = services.registered_model_rename(actor=user, model=_model(user, data), new_name=data.get("new_name"))
    return {"registered_model": registered_model_json(model)}


@endpoint("DELETE")
def registered_model_delete(request, user, data):
    """``registered-models/delete`` ``{name}``: the model, its versions and aliases (Project admins); ``{}``."""
    services.registered_model_delete(actor=user, model=_model(user, data))
    return {}


@endpoint("GET")
def registered_model_search(request, user, data):
    """``registered-models/search?filter=&max_results=&order_by=&page_token=`` → ``{registered_models,
    next_page_token?}``; ``max_results`` up to 1000 (below 1: an empty page, as on an MLflow server), else 400."""
    models, token = selectors.registered_model_search(
        user=user,
        filter_string=str_arg(data, "filter", required=False, max_length=4000),
        order_by=_list(data.get("order_by")),
        max_results=data.get("max_results"),
        page_token=data.get("page_token"),
    )
    return page_answer("registered_models", [registered_model_json(m) for m in models], token)


@endpoint("POST", "GET")
def registered_model_latest_versions(request, user, data):
    """``registered-models/get-latest-versions`` ``{name, stages?}`` → ``{model_versions}``; a stage that is not one
    of MLflow's → 400."""
    found = selectors.latest_versions(model=_model(user, data), stages=_list(data.get("stages")))
    return {"model_versions": [model_version_json(v) for v in found]}


@endpoint("POST")
def registered_model_set_tag(request, user, data):
    """``registered-models/set-tag`` ``{name, key, value}`` (members); ``{}``."""
    services.registered_model_tag_set(
        actor=user, model=_model(user, data), key=data.get("key"), value=str(data.get("value") or "")
    )
    return {}


@endpoint("DELETE")
def registered_model_delete_tag(request, user, data):
    """``registered-models/delete-tag`` ``{name, key}`` → ``{}``, also when the tag is not set (as on an MLflow
    server); an unknown model → 404."""
    services.registered_model_tag_set(actor=user, model=_model(user, data), key=data.get("key"), value=None)
    return {}


@endpoint("POST", "GET", "DELETE")
def registered_model_alias(request, user, data):
    """``registered-models/alias``, as an MLflow server answers: POST ``{name, alias, version}`` sets it, DELETE
    ``{name, alias}`` removes it (Project admins; ``{}``, also when it is not set); GET ``?name=&alias=`` →
    ``{model_version}`` (``latest``: the newest version), an alias that is not set → 400 INVALID_PARAMETER_VALUE.
    An unknown model → 404."""
    alias = str_arg(data, "alias", max_length=255)
    if request.method == "GET":
        version = selectors.model_version_by_alias(user=user, name=str_arg(data, "name", max_length=250), alias=alias)
        return {"model_version": model_version_json(version)}
    model = _model(user, data)
    if request.method == "DELETE":
        services.model_alias_delete(actor=user, model=model, alias=alias, missing_ok=True)
    else:
        version = _version(user, data)
        services.model_alias_set(actor=user, model=model, alias=alias, version=version)
    return {}


@endpoint("POST", run_token_allowed=True)
def model_version_create(request, user, data):
    """``model-versions/create`` ``{name, source, run_id?, model_id?, tags?, description?}`` → ``{model_version}``;
    members of the Project of the run or logged model; a Job's Run token only from its own Run."""
    run = logged = None
    if str_arg(data, "run_id", required=False, max_length=128):
        run = tracking_selectors.run_get(user=user, run_id=data["run_id"])
    if str_arg(data, "model_id", required=False, max_length=40):
        logged = logged_models.logged_model_get(user=user, model_id=data["model_id"])
    if token_run(request) is not None:
        owners = ([run] if run else []) + ([logged.run] if logged else [])
        if not owners or None in owners:
            raise MlflowError(PERMISSION_DENIED, f"{RUN_TOKEN_SCOPE}: register a model its own run logged")
        for owner in owners:
            require_own_run(request, owner)
    version = services.model_version_create(
        actor=user,
        model=_model(user, data),
        source=data.get("source"),
        run=run or (logged.run if logged else None),
        logged_model=logged,
        tags=data.get("tags"),
        description=data.get("description"),
    )
    return {"model_version": model_version_json(version, aliases=[])}


@endpoint("GET")
def model_version_get(request, user, data):
    """``model-versions/get?name=&version=`` → ``{model_version}``; an unknown model or version → 404, a version
    that is not an integer → 400 (so for every ``version`` below)."""
    return {"model_version": model_version_json(_version(user, data))}


@endpoint("PATCH")
def model_version_update(request, user, data):
    """``model-versions/update`` ``{name, version, description}`` → ``{model_version}`` (members)."""
    version = services.model_version_update(
        actor=user, version=_version(user, data), description=data.get("description")
    )
    return {"model_version": model_version_json(version)}


@endpoint("DELETE")
def model_version_delete(request, user, data):
    """``model-versions/delete`` ``{name, version}`` (Project admins); ``{}``."""
    services.model_version_delete(actor=user, version=_version(user, data))
    return {}


@endpoint("GET")
def model_version_search(request, user, data):
    """``model-versions/search?filter=&max_results=&order_by=&page_token=`` → ``{model_versions,
    next_page_token?}``; ``max_results`` 1 to 200,000, else 400."""
    versions, token = selectors.model_version_search(
        user=user,
        filter_string=str_arg(data, "filter", required=False, max_length=4000),
        order_by=_list(data.get("order_by")),
        max_results=data.get("max_results"),
        page_token=data.get("page_token"),
    )
    return page_answer("model_versions", [model_version_json(v) for v in versions], token)


@endpoint("GET")
def model_version_download_uri(request, user, data):
    """``model-versions/get-download-uri?name=&version=`` → ``{artifact_uri}``: what ``models:/name/version``
    downloads through the artifact proxy."""
    return {"artifact_uri": selectors.download_uri(_version(user, data))}


@endpoint("POST")
def model_version_set_tag(request, user, data):
    """``model-versions/set-tag`` ``{name, version, key, value}`` (members); ``{}``."""
    services.model_version_tag_set(
        actor=user, version=_version(user, data), key=data.get("key"), value=str(data.get("value") or "")
    )
    return {}


@endpoint("DELETE")
def model_version_delete_tag(request, user, data):
    """``model-versions/delete-tag`` ``{name, version, key}`` → ``{}``, also when the tag is not set; an unknown
    model or version → 404, a version that is not an integer → 400."""
    services.model_version_tag_set(actor=user, version=_version(user, data), key=data.get("key"), value=None)
    return {}


@endpoint("POST")
def model_version_transition_stage(request, user, data):
    """``model-versions/transition-stage``: stages are MLflow's deprecated scheme; mado has aliases (400)."""
    raise MlflowError(
        INVALID_PARAMETER_VALUE, "mado has no model stages: set an alias instead (set_registered_model_alias)"
    )
