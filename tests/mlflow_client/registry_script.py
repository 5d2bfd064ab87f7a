"""One stock-client script over the MLflow model registry, run unchanged against mado and against a real ``mlflow
server`` (tests/mlflow_client/test_mlflow_registry_parity.py).

``registry_script(client)`` makes each registry call the stock ``MlflowClient`` has, the happy ones and the ones that
fail (unknown names, versions and aliases, non-integer versions, duplicates, deletes of what is not there, bad page
tokens, ``max_results`` 0 / 1 / large, bad filters), in one order, and records per call its label, the HTTP status
of the server's answer (the last one when the client sent several) and the ``error_code`` of the
``MlflowException`` it raised (None when it succeeded). A call the client refuses before sending anything has
status None.
"""

from contextlib import contextmanager

from mlflow.exceptions import MlflowException
from mlflow.utils import rest_utils

ALPHA, BETA, GAMMA, UNKNOWN = "parity-alpha", "parity-beta", "parity-gamma", "parity-unknown"


@contextmanager
def _statuses():
    """The HTTP statuses of the answers the client receives meanwhile (``call_endpoint`` sends through
    ``rest_utils.http_request``)."""
    seen, real = [], rest_utils.http_request

    def recording(*args, **kwargs):
        response = real(*args, **kwargs)
        seen.append(response.status_code)
        return response

    rest_utils.http_request = recording
    try:
        yield seen
    finally:
        rest_utils.http_request = real


def registry_script(client) -> list[tuple[str, int | None, str | None]]:
    """``[(label, http_status, error_code)]``, one per call, in order."""
    results = []
    with _statuses() as seen:

        def call(label, fn, *args, **kwargs):
            seen.clear()
            code, value = None, None
            try:
                value = fn(*args, **kwargs)
            except MlflowException as exc:
                code = exc.error_code
            results.append((label, seen[-1] if seen else None, code))
            return value

        _script(client, call)
    return results


def _script(c, call) -> None:
    experiment_id = call("create experiment", c.create_experiment, "registry-parity")
    run = call("create run", c.create_run, experiment_id)
    run_id, source = run.info.run_id, f"{run.info.artifact_uri}/model"

    # Registered models.
    call("create model", c.create_registered_model, ALPHA, tags={"team": "vision"}, description="first")
    call("create model: duplicate", c.create_registered_model, ALPHA)
    call("create model: empty name", c.create_registered_model, "")
    call("create second model", c.create_registered_model, BETA)
    call("get model", c.get_registered_model, ALPHA)
    call("get model: unknown", c.get_registered_model, UNKNOWN)
    call("update model", c.update_registered_model, ALPHA, description="changed")
    call("update model: unknown", c.update_registered_model, UNKNOWN, description="x")
    call("set model tag", c.set_registered_model_tag, ALPHA, "stage", "qa")
    call("set model tag: unknown model", c.set_registered_model_tag, UNKNOWN, "stage", "qa")
    call("delete model tag", c.delete_registered_model_tag, ALPHA, "stage")
    call("delete model tag: already deleted", c.delete_registered_model_tag, ALPHA, "stage")
    call("delete model tag: never set", c.delete_registered_model_tag, ALPHA, "never")
    call("delete model tag: unknown model", c.delete_registered_model_tag, UNKNOWN, "stage")
    call("rename model", c.rename_registered_model, BETA, GAMMA)
    call("rename model: old name now unknown", c.get_registered_model, BETA)
    call("rename model: to a taken name", c.rename_registered_model, GAMMA, ALPHA)
    call("rename model: unknown", c.rename_registered_model, UNKNOWN, "parity-other")
    call("rename model: to an empty name", c.rename_registered_model, GAMMA, "")

    # Model versions.
    call("create version 1", c.create_model_version, ALPHA, source, run_id=run_id, await_creation_for=0)
    call("create version 2", c.create_model_version, ALPHA, source, run_id=run_id, tags={"k": "v"})
    call("create version: unknown model", c.create_model_version, UNKNOWN, source, run_id=run_id)
    call("get version", c.get_model_version, ALPHA, "1")
    call("get version: unknown number", c.get_model_version, ALPHA, "99")
    call("get version: not an integer", c.get_model_version, ALPHA, "abc")
    call("get version: a decimal", c.get_model_version, ALPHA, "1.5")
    call("get version: negative", c.get_model_version, ALPHA, "-1")
    call("get version: unknown model", c.get_model_version, UNKNOWN, "1")
    call("get version: not an integer, unknown model", c.get_model_version, UNKNOWN, "abc")
    call("get version: padded", c.get_model_version, ALPHA, " 1")
    call("update version", c.update_model_version, ALPHA, "1", description="baseline")
    call("update version: unknown number", c.update_model_version, ALPHA, "99", description="x")
    call("update version: not an integer", c.update_model_version, ALPHA, "abc", description="x")
    call("download uri", c.get_model_version_download_uri, ALPHA, "1")
    call("download uri: unknown number", c.get_model_version_download_uri, ALPHA, "99")
    call("download uri: not an integer", c.get_model_version_download_uri, ALPHA, "abc")
    call("set version tag", c.set_model_version_tag, ALPHA, "1", "reviewed", "yes")
    call("set version tag: unknown number", c.set_model_version_tag, ALPHA, "99", "reviewed", "yes")
    call("set version tag: not an integer", c.set_model_version_tag, ALPHA, "abc", "reviewed", "yes")
    call("set version tag: unknown model", c.set_model_version_tag, UNKNOWN, "1", "reviewed", "yes")
    call("delete version tag", c.delete_model_version_tag, ALPHA, "1", "reviewed")
    call("delete version tag: already deleted", c.delete_model_version_tag, ALPHA, "1", "reviewed")
    call("delete version tag: unknown number", c.delete_model_version_tag, ALPHA, "99", "reviewed")
    call("delete version tag: not an integer", c.delete_model_version_tag, ALPHA, "abc", "reviewed")
    call("latest versions", c.get_latest_versions, ALPHA)
    call("latest versions: stage None", c.get_latest_versions, ALPHA, stages=["None"])
    call("latest versions: stage Production", c.get_latest_versions, ALPHA, stages=["Production"])
    call("latest versions: unknown stage", c.get_latest_versions, ALPHA, stages=["Bogus"])
    call("latest versions: unknown model", c.get_latest_versions, UNKNOWN)

    # Aliases.
    call("set alias", c.set_registered_model_alias, ALPHA, "champion", "1")
    call("move alias", c.set_registered_model_alias, ALPHA, "champion", "2")
    call("set alias: unknown version", c.set_registered_model_alias, ALPHA, "challenger", "99")
    call("set alias: not an integer version", c.set_registered_model_alias, ALPHA, "challenger", "abc")
    call("set alias: unknown model", c.set_registered_model_alias, UNKNOWN, "champion", "1")
    call("set alias: 'latest'", c.set_registered_model_alias, ALPHA, "latest", "1")
    call("set alias: 'latest', unknown model", c.set_registered_model_alias, UNKNOWN, "latest", "1")
    call("set alias: version-like", c.set_registered_model_alias, ALPHA, "v1", "1")
    call("get by alias", c.get_model_version_by_alias, ALPHA, "champion")
    call("get by alias: unknown alias", c.get_model_version_by_alias, ALPHA, "nobody")
    call("get by alias: unknown model", c.get_model_version_by_alias, UNKNOWN, "champion")
    call("get by alias: 'latest'", c.get_model_version_by_alias, ALPHA, "latest")
    call("get by alias: malformed", c.get_model_version_by_alias, ALPHA, "a b")
    call("delete alias", c.delete_registered_model_alias, ALPHA, "champion")
    call("delete alias: already deleted", c.delete_registered_model_alias, ALPHA, "champion")
    call("delete alias: never set", c.delete_registered_model_alias, ALPHA, "nobody")
    call("delete alias: unknown model", c.delete_registered_model_alias, UNKNOWN, "champion")
    call("delete alias: malformed", c.delete_registered_model_alias, ALPHA, "a b")
    call("get by alias: deleted alias", c.get_model_version_by_alias, ALPHA, "champion")

    # Searches.
    call("search models", c.search_registered_models)
    call("search models: max_results 0", c.search_registered_models, max_results=0)
    call("search models: max_results -1", c.search_registered_models, max_results=-1)
    first = call("search models: max_results 1", c.search_registered_models, max_results=1)
    token = first.token if first is not None else None
    call("search models: next page", c.search_registered_models, max_results=1, page_token=token)
    call("search models: max_results 1000", c.search_registered_models, max_results=1000)
    call("search models: max_results 1001", c.search_registered_models, max_results=1001)
    call("search models: bad page token", c.search_registered_models, page_token="not-a-token")
    call("search models: by name", c.search_registered_models, filter_string=f"name = '{ALPHA}'")
    call("search models: name LIKE", c.search_registered_models, filter_string="name LIKE 'parity%'")
    call("search models: by tag", c.search_registered_models, filter_string="tags.team = 'vision'")
    call("search models: bad filter", c.search_registered_models, filter_string="bogus ~ 1")
    call("search models: order by name", c.search_registered_models, order_by=["name DESC"])
    call("search models: bad order by", c.search_registered_models, order_by=["bogus"])
    call("search versions", c.search_model_versions)
    call("search versions: max_results 0", c.search_model_versions, max_results=0)
    call("search versions: max_results -1", c.search_model_versions, max_results=-1)
    first = call("search versions: max_results 1", c.search_model_versions, max_results=1)
    token = first.token if first is not None else None
    call("search versions: next page", c.search_model_versions, max_results=1, page_token=token)
    call("search versions: max_results 200000", c.search_model_versions, max_results=200_000)
    call("search versions: bad page token", c.search_model_versions, page_token="not-a-token")
    call("search versions: by name", c.search_model_versions, filter_string=f"name = '{ALPHA}'")
    call("search versions: by run", c.search_model_versions, filter_string=f"run_id = '{run_id}'")
    call("search versions: bad filter", c.search_model_versions, filter_string="bogus ~ 1")

    # Stages (mado has aliases, not stages: docs/api.md#model-registry).
    call("transition stage", c.transition_model_version_stage, ALPHA, "1", "Production")

    # Deletions.
    call("delete version", c.delete_model_version, ALPHA, "2")
    call("delete version: already deleted", c.delete_model_version, ALPHA, "2")
    call("delete version: not an integer", c.delete_model_version, ALPHA, "abc")
    call("get version: deleted", c.get_model_version, ALPHA, "2")
    call("create version 3 (numbers are not reused)", c.create_model_version, ALPHA, source, run_id=run_id)
    call("delete model", c.delete_registered_model, GAMMA)
    call("delete model: already deleted", c.delete_registered_model, GAMMA)
    call("get model: deleted", c.get_registered_model, GAMMA)
    call("delete model: with versions", c.delete_registered_model, ALPHA)
    call("get version: model deleted", c.get_model_version, ALPHA, "1")
