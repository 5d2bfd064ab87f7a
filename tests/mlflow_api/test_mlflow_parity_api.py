"""MLflow endpoints added for parity (docs/design/interfaces.md#mlflow; docs/design/runs.md#liveness): who may call
them, hostile input, the silence clock."""

import pytest

from runs.models import Project, Run
from tests.factories import api_key

API = "/api/2.0/mlflow/"


@pytest.fixture
def call(client):
    def make(user, path, data):
        auth = {"HTTP_AUTHORIZATION": f"Bearer {api_key(user)}"}
        return client.post(API + path, data, content_type="application/json", **auth)

    return make


@pytest.fixture
def mlrun(call, member, project):
    answer = call(member, "runs/create", {"experiment_id": str(project.pk)})
    return answer.json()["run"]["info"]["run_id"]


WRITES = [
    ("runs/delete", lambda project, run_id: {"run_id": run_id}),
    ("runs/restore", lambda project, run_id: {"run_id": run_id}),
    ("runs/update", lambda project, run_id: {"run_id": run_id, "status": "RUNNING"}),
    (
        "experiments/set-experiment-tag",
        lambda project, run_id: {"experiment_id": str(project.pk), "key": "a", "value": "b"},
    ),
    ("experiments/delete-experiment-tag", lambda project, run_id: {"experiment_id": str(project.pk), "key": "a"}),
]


@pytest.mark.parametrize("path, body", WRITES)
def test_outsiders_get_404_and_viewers_403_on_every_new_write(call, outsider, viewer, project, mlrun, path, body):
    Run.objects.filter(external_id=mlrun).update(status="finished")
    hidden = call(outsider, path, body(project, mlrun))
    assert hidden.status_code == 404 and hidden.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    refused = call(viewer, path, body(project, mlrun))
    assert refused.status_code == 403 and refused.json()["error_code"] == "PERMISSION_DENIED"
    run = Run.objects.get(external_id=mlrun)
    assert (run.status, run.deleted_at, Project.objects.get(pk=project.pk).tags) == ("finished", None, {})


@pytest.mark.parametrize(
    "body, field",
    [
        ({"key": "", "value": "x"}, "key"),
        ({"key": "k" * 251, "value": "x"}, "key"),
        ({"key": "k", "value": "v" * 5001}, "value"),
        ({"key": "k\x00", "value": "x"}, "key"),
        ({"key": ["k"], "value": "x"}, "key"),
    ],
)
def test_hostile_experiment_tags_are_refused_naming_the_field(call, member, project, body, field):
    answer = call(member, "experiments/set-experiment-tag", {"experiment_id": str(project.pk), **body})
    assert answer.status_code == 400 and field in answer.json()["message"]
    assert Project.objects.get(pk=project.pk).tags == {}


@pytest.mark.parametrize("experiment_id", ["00", "-0", "0 ", "1e3", "' or 1=1"])
def test_only_exactly_0_is_the_default_experiment(call, member, experiment_id):
    answer = call(member, "runs/create", {"experiment_id": experiment_id})
    assert answer.status_code == 404 and not Project.objects.filter(default_for=member).exists()


def test_a_bad_run_view_type_is_refused(call, member, project):
    answer = call(member, "runs/search", {"experiment_ids": [str(project.pk)], "run_view_type": "EVERYTHING"})
    assert answer.status_code == 400 and "run_view_type" in answer.json()["message"]


def test_a_run_written_by_the_sdk_is_not_reopened_by_the_mlflow_api(call, member, mlrun):
    from django.utils import timezone

    Run.objects.filter(external_id=mlrun).update(status="crashed", heartbeat_at=timezone.now())
    answer = call(member, "runs/update", {"run_id": mlrun, "status": "RUNNING"})
    assert answer.status_code == 400 and "resume='allow'" in answer.json()["message"]
    assert Run.objects.get(external_id=mlrun).status == "crashed"


def test_mlflow_writes_restart_the_silence_clock(call, member, mlrun):
    Run.objects.filter(external_id=mlrun).update(last_write_at=None)
    call(member, "runs/log-metric", {"run_id": mlrun, "key": "loss", "value": 1.0, "timestamp": 1, "step": 0})
    assert Run.objects.get(external_id=mlrun).last_write_at is not None


@pytest.mark.parametrize(
    "datasets, field",
    [
        ("digits", "datasets must be a list"),
        ([{"dataset": "x"}], "datasets[0].dataset must be an object"),
        ([{"dataset": {"name": "", "digest": "v1"}}], "datasets[0].dataset.name"),
        ([{"dataset": {"name": "d", "digest": "v" * 101}}], "datasets[0].dataset.digest"),
        ([{"dataset": {"name": "d\x00", "digest": "v1"}}], "datasets[0].dataset.name"),
        ([{"dataset": {"name": "d", "digest": "v1", "source": 3}}], "datasets[0].dataset.source"),
    ],
)
def test_hostile_log_inputs_are_refused_naming_the_field(call, member, mlrun, datasets, field):
    answer = call(member, "runs/log-inputs", {"run_id": mlrun, "datasets": datasets})
    assert answer.status_code == 400 and field in answer.json()["message"]
    assert not Run.objects.get(external_id=mlrun).input_dataset_versions.exists()


def test_a_viewer_cannot_log_inputs(call, viewer, mlrun):
    body = {"run_id": mlrun, "datasets": [{"dataset": {"name": "d", "digest": "v1"}}]}
    assert call(viewer, "runs/log-inputs", body).status_code == 403
