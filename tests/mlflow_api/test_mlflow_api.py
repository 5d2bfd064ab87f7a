"""The MLflow tracking REST surface (/api/2.0/mlflow/): shapes, errors, permissions, filters, rules."""

import base64

import pytest

from runs.models import MetricPoint, Run
from tests.factories import api_key

pytestmark = pytest.mark.django_db
API = "/api/2.0/mlflow/"


@pytest.fixture
def call(client):
    def make(user, method, path, data=None, headers=None):
        extra = dict(headers or {})
        if user is not None:
            extra["HTTP_AUTHORIZATION"] = f"Bearer {api_key(user)}"
        if method == "GET":
            return client.get(API + path, data or {}, **extra)
        return client.post(API + path, data or {}, content_type="application/json", **extra)

    return make


@pytest.fixture
def mlrun(call, member, project):
    answer = call(
        member,
        "POST",
        "runs/create",
        {"experiment_id": str(project.pk), "run_name": "r1", "tags": [{"key": "team", "value": "a"}]},
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["run"]["info"]["run_id"]


def test_anonymous_gets_401_unauthenticated_json(call, project):
    answer = call(None, "GET", "experiments/get", {"experiment_id": str(project.pk)})
    assert answer.status_code == 401 and answer.json()["error_code"] == "UNAUTHENTICATED"


def test_basic_auth_with_password(client, member, project):
    member.set_password("pw")
    member.save()
    auth = "Basic " + base64.b64encode(f"{member.username}:pw".encode()).decode()
    answer = client.get(API + "experiments/get", {"experiment_id": project.pk}, HTTP_AUTHORIZATION=auth)
    assert answer.status_code == 200 and answer.json()["experiment"]["name"] == "Vision"
    bad = "Basic " + base64.b64encode(f"{member.username}:nope".encode()).decode()
    assert client.get(API + "experiments/get", {"experiment_id": project.pk}, HTTP_AUTHORIZATION=bad).status_code == 401


def test_outsider_gets_404_and_viewer_gets_403(call, outsider, viewer, project, mlrun):
    assert call(outsider, "GET", "runs/get", {"run_id": mlrun}).json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    assert call(outsider, "GET", "experiments/get", {"experiment_id": str(project.pk)}).status_code == 404
    assert call(viewer, "GET", "runs/get", {"run_id": mlrun}).status_code == 200
    answer = call(viewer, "POST", "runs/log-batch", {"run_id": mlrun, "params": [{"key": "a", "value": "1"}]})
    assert answer.status_code == 403 and answer.json()["error_code"] == "PERMISSION_DENIED"


def test_experiment_create_makes_an_admin_project_and_refuses_duplicates(call, member):
    answer = call(member, "POST", "experiments/create", {"name": "New exp"})
    experiment_id = answer.json()["experiment_id"]
    got = call(member, "GET", "experiments/get-by-name", {"experiment_name": "New exp"}).json()["experiment"]
    assert got["experiment_id"] == experiment_id and got["artifact_location"] == f"mlflow-artifacts:/{experiment_id}"
    again = call(member, "POST", "experiments/create", {"name": "New exp"})
    assert again.status_code == 400 and again.json()["error_code"] == "RESOURCE_ALREADY_EXISTS"
    bad = call(member, "POST", "experiments/create", {"name": "x", "artifact_location": "file:///etc"})
    assert bad.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    missing = call(member, "GET", "experiments/get-by-name", {"experiment_name": "nope"})
    assert missing.status_code == 404


def test_run_shape(call, member, project, mlrun):
    run = call(member, "GET", "runs/get", {"run_id": mlrun}).json()["run"]
    info = run["info"]
    assert info["run_id"] == info["run_uuid"] == mlrun and info["status"] == "RUNNING"
    assert info["artifact_uri"] == f"mlflow-artifacts:/{project.pk}/{mlrun}/artifacts"
    assert info["experiment_id"] == str(project.pk) and info["start_time"] > 1_600_000_000_000
    assert {"key": "team", "value": "a"} in run["data"]["tags"]
    assert {"key": "mado.kind", "value": "training"} in run["data"]["tags"]


def test_log_batch_nan_strings_int64_strings_and_dedup(call, member, mlrun):
    batch = {
        "run_id": mlrun,
        "metrics": [
            {"key": "loss", "value": "NaN", "timestamp": "1700000000123", "step": "1"},
            {"key": "loss", "value": 0.5, "timestamp": 1700000000124, "step": 2},
            {"key": "loss", "value": "-Infinity", "timestamp": 1700000000125, "step": 3},
        ],
    }
    assert call(member, "POST", "runs/log-batch", batch).status_code == 200
    assert call(member, "POST", "runs/log-batch", batch).status_code == 200  # a retried POST
    partial = {"run_id": mlrun, "key": "loss", "value": 0.5, "timestamp": 1700000000124, "step": 2}
    assert call(member, "POST", "runs/log-metric", partial).status_code == 200
    run = Run.objects.get(external_id=mlrun)
    assert MetricPoint.objects.filter(run=run).count() == 3
    history = call(member, "GET", "metrics/get-history", {"run_id": mlrun, "metric_key": "loss"}).json()["metrics"]
    assert [m["value"] for m in history] == ["NaN", 0.5, "-Infinity"]
    assert history[0]["timestamp"] == 1700000000123
    latest = call(member, "GET", "runs/get", {"run_id": mlrun}).json()["run"]["data"]["metrics"]
    assert latest == [{"key": "loss", "value": "-Infinity", "timestamp": 1700000000125, "step": 3}]


def test_metric_history_is_paginated(call, member, mlrun):
    metrics = [{"key": "m", "value": i, "timestamp": 1700000000000 + i, "step": i} for i in range(5)]
    call(member, "POST", "runs/log-batch", {"run_id": mlrun, "metrics": metrics})
    first = call(member, "GET", "metrics/get-history", {"run_id": mlrun, "metric_key": "m", "max_results": 3}).json()
    assert [m["step"] for m in first["metrics"]] == [0, 1, 2]
    rest = call(
        member,
        "GET",
        "metrics/get-history",
        {"run_id": mlrun, "metric_key": "m", "max_results": 3, "page_token": first["next_page_token"]},
    ).json()
    assert [m["step"] for m in rest["metrics"]] == [3, 4] and "next_page_token" not in rest


def test_param_rule(call, member, mlrun):
    log = lambda value: call(member, "POST", "runs/log-parameter", {"run_id": mlrun, "key": "lr", "value": value})  # noqa: E731
    assert log("0.1").status_code == 200
    assert log("0.1").status_code == 200
    answer = log("0.2")
    assert answer.status_code == 400 and answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert Run.objects.get(external_id=mlrun).parameters == {"lr": "0.1"}


def test_search_filters_order_and_pages(call, member, project):
    ids = []
    for index in range(3):
        run_id = call(member, "POST", "runs/create", {"experiment_id": str(project.pk)}).json()["run"]["info"]["run_id"]
        call(
            member,
            "POST",
            "runs/log-batch",
            {
                "run_id": run_id,
                "params": [{"key": "opt", "value": "adam" if index else "sgd"}],
                "tags": [{"key": "t.x", "value": str(index)}],
                "metrics": [{"key": "acc", "value": index / 10, "timestamp": 1700000000000, "step": 0}],
            },
        )
        ids.append(run_id)
    call(member, "POST", "runs/update", {"run_id": ids[0], "status": "KILLED"})
    assert Run.objects.get(external_id=ids[0]).status == "aborted"

    def search(**body):
        answer = call(member, "POST", "runs/search", {"experiment_ids": [str(project.pk)], **body})
        assert answer.status_code == 200, answer.content
        return answer.json()

    assert {r["info"]["run_id"] for r in search(filter="params.opt = 'adam'")["runs"]} == set(ids[1:])
    assert [r["info"]["run_id"] for r in search(filter="tags.`t.x` = '2'")["runs"]] == [ids[2]]
    assert [r["info"]["run_id"] for r in search(filter="attributes.status = 'KILLED'")["runs"]] == [ids[0]]
    assert [
        r["info"]["run_id"]
        for r in search(filter="metrics.acc > 0.05 and params.opt = 'adam'", order_by=["metrics.acc DESC"])["runs"]
    ] == [ids[2], ids[1]]
    page = search(max_results=2, order_by=["metrics.acc ASC"])
    assert [r["info"]["run_id"] for r in page["runs"]] == ids[:2]
    rest = search(max_results=2, order_by=["metrics.acc ASC"], page_token=page["next_page_token"])
    assert [r["info"]["run_id"] for r in rest["runs"]] == [ids[2]]
    bad = call(member, "POST", "runs/search", {"experiment_ids": [str(project.pk)], "filter": "params.x ~ 1"})
    assert bad.status_code == 400 and bad.json()["error_code"] == "INVALID_PARAMETER_VALUE"


def test_kind_from_tag_and_status_mapping(call, member, project):
    answer = call(
        member,
        "POST",
        "runs/create",
        {"experiment_id": str(project.pk), "tags": [{"key": "mado.kind", "value": "fine_tuning"}]},
    )
    run_id = answer.json()["run"]["info"]["run_id"]
    assert Run.objects.get(external_id=run_id).kind == "fine_tuning"
    done = call(member, "POST", "runs/update", {"run_id": run_id, "status": "FINISHED", "end_time": "1700000000000"})
    assert done.json()["run_info"]["status"] == "FINISHED" and done.json()["run_info"]["end_time"]
    assert (
        call(member, "POST", "runs/update", {"run_id": run_id, "status": "FAILED"}).json()["error_code"]
        == "INVALID_STATE"
    )
    bad = call(
        member,
        "POST",
        "runs/create",
        {"experiment_id": str(project.pk), "tags": [{"key": "mado.kind", "value": "weird"}]},
    )
    assert bad.status_code == 400


def test_tags_delete_and_unknown_paths_answer_json(call, member, mlrun):
    assert call(member, "POST", "runs/delete-tag", {"run_id": mlrun, "key": "team"}).status_code == 200
    assert call(member, "POST", "runs/delete-tag", {"run_id": mlrun, "key": "team"}).status_code == 404
    assert (
        call(member, "POST", "experiments/delete", {"experiment_id": "1"}).json()["error_code"]
        == "INVALID_PARAMETER_VALUE"
    )
    # MLflow's server: experiment_ids is required; a search of an experiment without models is an empty page
    assert call(member, "POST", "logged-models/search", {}).json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert call(member, "POST", "logged-models/search", {"experiment_ids": ["1"]}).json() == {"models": []}
    for answer in (call(member, "GET", "nope"), call(member, "GET", "../3.0/mlflow/server-info")):
        assert answer.status_code == 404 and answer["Content-Type"] == "application/json"


def test_the_api_also_answers_under_the_mlflow_path_prefix(client, member, project, mlrun):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_key(member)}"}
    answer = client.get("/mlflow" + API + "runs/get", {"run_id": mlrun}, **auth)
    assert answer.status_code == 200 and answer.json()["run"]["info"]["run_id"] == mlrun
    listing = client.get(
        "/mlflow/api/2.0/mlflow-artifacts/artifacts", {"path": f"{project.pk}/{mlrun}/artifacts"}, **auth
    )
    assert listing.status_code == 200
