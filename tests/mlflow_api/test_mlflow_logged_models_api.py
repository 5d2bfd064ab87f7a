"""MLflow 3 logged models on the wire (``/api/2.0/mlflow/logged-models…``, ``runs/outputs``, ``runs/log-model``) and
their files through the artifact proxy: MLflow's answers and error codes, hostile input, who may do what
(docs/design/interfaces.md#mlflow; docs/design/runs.md#write-rule)."""

import json

import pytest
from rest_framework.test import APIClient

from checkpoints.models import Artifact
from runs.metrics import metrics_ingest
from runs.models import LoggedModel, LoggedModelStatus, RunTag
from tests.factories import RunFactory, api_key, run_token

pytestmark = pytest.mark.django_db
API = "/api/2.0/mlflow/"
ART = "/api/2.0/mlflow-artifacts/artifacts/"


def client_of(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key(user)}")
    return client


def send(user, method: str, path: str, data=None):
    client = client_of(user)
    if method == "GET":
        return client.get(API + path, data or {})
    return getattr(client, method.lower())(API + path, json.dumps(data or {}), content_type="application/json")


def create(user, project, **fields):
    answer = send(user, "POST", "logged-models", {"experiment_id": str(project.pk), **fields})
    assert answer.status_code == 200, answer.content
    return answer.json()["model"]


def error_of(answer) -> tuple[int, str]:
    return answer.status_code, answer.json()["error_code"]


@pytest.fixture
def model(creator, project, run):
    return create(
        creator,
        project,
        name="net",
        source_run_id=run.external_id,
        tags=[{"key": "team", "value": "a"}],
        params=[{"key": "lr", "value": "0.1"}],
    )


def files_url(model_json, path="") -> str:
    root = model_json["info"]["artifact_uri"].removeprefix("mlflow-artifacts:/")
    return ART + root + (f"/{path}" if path else "")


def test_create_answers_mlflows_logged_model_shape(model, project, run, creator):
    info = model["info"]
    assert info["model_id"].startswith("m-") and len(info["model_id"]) == 34
    assert info["experiment_id"] == str(project.pk) and info["source_run_id"] == run.external_id
    assert info["status"] == "LOGGED_MODEL_PENDING" and info["creator_id"] == creator.pk
    assert info["artifact_uri"] == f"mlflow-artifacts:/{project.pk}/models/{info['model_id']}/artifacts"
    assert info["tags"] == [{"key": "team", "value": "a"}] and model["data"]["params"] == [
        {"key": "lr", "value": "0.1"}
    ]


@pytest.mark.parametrize(
    "name",
    ["a/b", "..", "x.y", "m:1", "50%", 'q"', "q'", "new\nline", "nul\x00", "x" * 251, 123, ["a"], {"a": 1}, True],
)
def test_hostile_names_are_refused_and_nothing_is_stored(creator, project, name):
    answer = send(creator, "POST", "logged-models", {"experiment_id": str(project.pk), "name": name})
    assert error_of(answer) == (400, "INVALID_PARAMETER_VALUE"), name
    assert not LoggedModel.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"tags": "team=a"},
        {"tags": [["team", "a"]]},
        {"tags": [{"key": "", "value": "a"}]},
        {"params": [{"key": "k", "value": 1}]},
        {"params": [{"key": f"k{i}", "value": "v"} for i in range(101)]},
        {"model_type": 5},
        {"experiment_id": 1.5},
        {"experiment_id": "1 OR 1=1"},
        {"source_run_id": ["x"]},
    ],
)
def test_hostile_json_fields_are_refused(creator, project, body):
    answer = send(creator, "POST", "logged-models", {"experiment_id": str(project.pk), **body})
    assert answer.status_code in (400, 404) and answer.json()["error_code"] in (
        "INVALID_PARAMETER_VALUE",
        "RESOURCE_DOES_NOT_EXIST",
    ), body
    assert not LoggedModel.objects.exists()


def test_a_body_that_is_not_a_json_object_is_refused(creator, project):
    client = client_of(creator)
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        answer = client.post(API + "logged-models", raw, content_type="application/json")
        assert error_of(answer) == (400, "INVALID_PARAMETER_VALUE")


def test_unknown_and_foreign_models_are_resource_does_not_exist(model, outsider, creator):
    for model_id in ("m-" + "0" * 32, "x" * 500, "%00", model["info"]["model_id"]):
        who = outsider if model_id == model["info"]["model_id"] else creator
        answer = send(who, "GET", f"logged-models/{model_id}")
        assert error_of(answer) == (404, "RESOURCE_DOES_NOT_EXIST"), model_id
    assert "Logged model with ID" in send(creator, "GET", "logged-models/m-" + "0" * 32).json()["message"]


@pytest.mark.parametrize("status", ["DONE", "", None, True, 7, ["LOGGED_MODEL_READY"]])
def test_finalize_with_a_bad_status_changes_nothing(model, creator, status):
    answer = send(creator, "PATCH", f"logged-models/{model['info']['model_id']}", {"status": status})
    assert error_of(answer) == (400, "INVALID_PARAMETER_VALUE")
    assert LoggedModel.objects.get().status == LoggedModelStatus.PENDING


def test_finalize_accepts_the_enum_name_and_number(model, creator):
    path = f"logged-models/{model['info']['model_id']}"
    assert send(creator, "PATCH", path, {"status": 2}).json()["model"]["info"]["status"] == "LOGGED_MODEL_READY"
    answer = send(creator, "PATCH", path, {"status": "LOGGED_MODEL_UPLOAD_FAILED"})
    assert answer.json()["model"]["info"]["status"] == "LOGGED_MODEL_UPLOAD_FAILED"


def test_another_member_cannot_change_the_model_but_reads_it(model, member):
    path = f"logged-models/{model['info']['model_id']}"
    assert send(member, "GET", path).status_code == 200
    assert error_of(send(member, "PATCH", path, {"status": "LOGGED_MODEL_READY"})) == (403, "PERMISSION_DENIED")
    assert error_of(send(member, "DELETE", path)) == (403, "PERMISSION_DENIED")
    assert LoggedModel.objects.get().deleted_at is None


def test_params_never_change_once_logged(model, creator):
    path = f"logged-models/{model['info']['model_id']}/params"
    assert (
        send(
            creator, "POST", path, {"params": [{"key": "lr", "value": "0.1"}, {"key": "wd", "value": "0"}]}
        ).status_code
        == 200
    )
    assert error_of(send(creator, "POST", path, {"params": [{"key": "lr", "value": "0.2"}]})) == (
        400,
        "INVALID_PARAMETER_VALUE",
    )
    assert LoggedModel.objects.get().params == {"lr": "0.1", "wd": "0"}


def test_a_tag_key_with_slashes_is_deleted_by_its_path(model, creator):
    model_id = model["info"]["model_id"]
    assert (
        send(creator, "PATCH", f"logged-models/{model_id}/tags", {"tags": [{"key": "a/b", "value": "1"}]}).status_code
        == 200
    )
    assert send(creator, "DELETE", f"logged-models/{model_id}/tags/a/b").status_code == 200
    assert LoggedModel.objects.get().tags == {"team": "a"}


@pytest.mark.parametrize(
    "body",
    [
        {"filter": "name = 'net' OR 1=1"},
        {"filter": "name = 'net'; DROP TABLE runs_loggedmodel"},
        {"filter": "metrics.acc > 0.5"},
        {"filter": "secret = 'x'"},
        {"filter": "name LIKE"},
        {"filter": "creation_time LIKE 'x'"},
        {"order_by": [{"field_name": "password"}]},
        {"order_by": "name"},
        {"max_results": 0},
        {"max_results": 5000},
        {"max_results": "many"},
        {"page_token": "forged!"},
        {"experiment_ids": "not-a-list-of-strings", "filter": "name = 'x"},
        {"experiment_ids": [1]},
        {"datasets": [{"dataset_name": "d"}]},
        {"filter": "name = 'a\x00b'"},
        {"filter": ["name = 'a'"]},
    ],
)
def test_hostile_searches_are_refused(model, creator, project, body):
    answer = send(creator, "POST", "logged-models/search", {"experiment_ids": [str(project.pk)], **body})
    assert error_of(answer) == (400, "INVALID_PARAMETER_VALUE"), body


def test_search_filters_orders_and_pages(creator, project, run):
    first = create(creator, project, name="alpha", model_type="agent", tags=[{"key": "stage", "value": "dev"}])
    second = create(creator, project, name="beta", source_run_id=run.external_id, params=[{"key": "lr", "value": "1"}])

    def ids(**body):
        answer = send(creator, "POST", "logged-models/search", {"experiment_ids": [str(project.pk)], **body})
        assert answer.status_code == 200, answer.content
        return [m["info"]["model_id"] for m in answer.json()["models"]]

    a, b = first["info"]["model_id"], second["info"]["model_id"]
    assert ids() == [b, a]  # newest first, as MLflow
    assert ids(order_by=[{"field_name": "name", "ascending": True}]) == [a, b]
    assert ids(filter="name LIKE 'al%'") == [a]
    assert ids(filter=f"source_run_id = '{run.external_id}' AND params.lr = '1'") == [b]
    assert ids(filter="tags.stage = 'dev' AND model_type = 'agent'") == [a]
    assert ids(filter="status = 'LOGGED_MODEL_PENDING'") == [b, a]
    assert ids(filter=f"creation_time > {first['info']['creation_timestamp_ms'] - 1}") == [b, a]
    page = send(creator, "POST", "logged-models/search", {"experiment_ids": [str(project.pk)], "max_results": 1}).json()
    rest = send(
        creator,
        "POST",
        "logged-models/search",
        {"experiment_ids": [str(project.pk)], "max_results": 1, "page_token": page["next_page_token"]},
    ).json()
    assert [m["info"]["model_id"] for m in page["models"] + rest["models"]] == [b, a] and "next_page_token" not in rest


def test_outputs_link_the_model_to_its_run_and_step_and_its_metrics_are_that_steps(model, creator, project, run):
    metrics_ingest(
        actor=creator,
        run=run,
        points=[
            {"key": "loss", "step": 3, "value": 0.5, "timestamp": 1},
            {"key": "loss", "step": 4, "value": 0.25, "timestamp": 2},
        ],
    )
    body = {"run_id": run.external_id, "models": [{"model_id": model["info"]["model_id"], "step": "3"}]}
    assert send(creator, "POST", "runs/outputs", body).status_code == 200
    got = send(creator, "GET", f"logged-models/{model['info']['model_id']}").json()["model"]
    assert [(m["key"], m["value"], m["step"]) for m in got["data"]["metrics"]] == [("loss", 0.5, 3)]
    assert LoggedModel.objects.get().step == 3
    outputs = send(creator, "GET", "runs/get", {"run_id": run.external_id}).json()["run"]["outputs"]
    assert outputs == {"model_outputs": [{"model_id": model["info"]["model_id"], "step": 3}]}


@pytest.mark.parametrize("models", [[{"model_id": "m-" + "0" * 32, "step": 1}], [{"step": "x"}], "m-1", [], [7]])
def test_outputs_refuse_unknown_models_and_bad_steps(model, creator, run, models):
    answer = send(creator, "POST", "runs/outputs", {"run_id": run.external_id, "models": models})
    assert answer.status_code in (400, 404) and LoggedModel.objects.get().step == 0


def test_outputs_refuse_a_model_of_another_run(model, creator, project):
    other = RunFactory(project=project, created_by=creator)
    body = {"run_id": other.external_id, "models": [{"model_id": model["info"]["model_id"], "step": 1}]}
    assert error_of(send(creator, "POST", "runs/outputs", body)) == (400, "INVALID_PARAMETER_VALUE")


def test_log_model_appends_to_the_runs_history_tag(creator, run):
    for name in ("a", "b"):
        body = {"run_id": run.external_id, "model_json": json.dumps({"artifact_path": name})}
        assert send(creator, "POST", "runs/log-model", body).status_code == 200
    history = json.loads(RunTag.objects.get(run=run, key="mlflow.log-model.history").value)
    assert [entry["artifact_path"] for entry in history] == ["a", "b"]
    for bad in ("not json", "[1]", 5, "x" * 70000):
        answer = send(creator, "POST", "runs/log-model", {"run_id": run.external_id, "model_json": bad})
        assert error_of(answer) == (400, "INVALID_PARAMETER_VALUE")


def test_a_run_token_creates_models_only_of_its_own_run(creator, project, run):
    token = run_token(run, creator)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.key}")
    bare = client.post(API + "logged-models", {"experiment_id": str(project.pk)}, format="json")
    assert error_of(bare) == (403, "PERMISSION_DENIED")
    other = RunFactory(project=project, created_by=creator)
    foreign = client.post(
        API + "logged-models", {"experiment_id": str(project.pk), "source_run_id": other.external_id}, format="json"
    )
    assert error_of(foreign) == (403, "PERMISSION_DENIED")
    own = client.post(
        API + "logged-models", {"experiment_id": str(project.pk), "source_run_id": run.external_id}, format="json"
    )
    assert own.status_code == 200 and LoggedModel.objects.get().run == run


# --- the model's files through the artifact proxy ------------------------------------------------------------------


def test_files_put_get_list_overwrite_and_delete(model, creator, admin, viewer):
    client = client_of(creator)
    assert (
        client.put(files_url(model, "data/model.pth"), b"v1", content_type="application/octet-stream").status_code
        == 200
    )
    assert (
        client.put(files_url(model, "MLmodel"), b"flavors: {}", content_type="application/octet-stream").status_code
        == 200
    )
    assert b"".join(client_of(viewer).get(files_url(model, "data/model.pth")).streaming_content) == b"v1"
    listing = client.get(ART.rstrip("/"), {"path": files_url(model).removeprefix(ART)}).json()["files"]
    assert listing == [{"path": "MLmodel", "is_dir": False, "file_size": 11}, {"path": "data", "is_dir": True}]
    directories = send(
        viewer,
        "GET",
        f"logged-models/{model['info']['model_id']}/artifacts/directories",
        {"artifact_directory_path": "data"},
    ).json()
    assert directories["files"] == [{"path": "data/model.pth", "is_dir": False, "file_size": 2}]
    assert directories["root_uri"] == model["info"]["artifact_uri"]
    # MLflow overwrites; the old digest stays in the history
    assert (
        client.put(files_url(model, "data/model.pth"), b"v2", content_type="application/octet-stream").status_code
        == 200
    )
    stored = Artifact.objects.get(logged_model__model_id=model["info"]["model_id"], path="data/model.pth")
    assert stored.size == 2 and len(stored.history) == 1 and stored.run is None
    assert (
        client_of(viewer).put(files_url(model, "x"), b"no", content_type="application/octet-stream").status_code == 403
    )
    # deleting files: Project admins (docs/design/checkpoints.md#deletion)
    assert client.delete(files_url(model, "data")).status_code == 403
    assert client_of(admin).delete(files_url(model, "data")).status_code == 200
    assert list(Artifact.objects.filter(logged_model__isnull=False).values_list("path", flat=True)) == ["MLmodel"]


@pytest.mark.parametrize("tail", ["../../x", "a/../../b", "%2e%2e/x", "a//b", "/etc/passwd", "a\\b", "a;b", "nul\x00"])
def test_hostile_file_paths_are_refused(model, creator, tail):
    answer = client_of(creator).put(files_url(model) + "/" + tail, b"x", content_type="application/octet-stream")
    assert answer.status_code in (400, 404), tail
    assert not Artifact.objects.filter(logged_model__isnull=False).exists()


def test_a_run_token_cannot_reach_a_model_logged_outside_a_run(creator, project, run):
    outside = create(creator, project, name="loose")  # no source_run_id: a model of no Run
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {run_token(run, creator).key}")
    assert client.put(files_url(outside, "w"), b"x", content_type="application/octet-stream").status_code == 403
    assert client.get(API + f"logged-models/{outside['info']['model_id']}").status_code == 403


def test_files_of_a_deleted_or_foreign_model_are_not_found(model, creator, outsider, other_project):
    moved = files_url(model, "f").replace(f"/{model['info']['experiment_id']}/", f"/{other_project.pk}/", 1)
    assert client_of(creator).put(moved, b"x", content_type="application/octet-stream").status_code == 404
    assert client_of(outsider).get(files_url(model, "f")).status_code == 404
    assert send(creator, "DELETE", f"logged-models/{model['info']['model_id']}").status_code == 200
    assert (
        send(creator, "DELETE", f"logged-models/{model['info']['model_id']}").status_code == 200
    )  # as MLflow: idempotent
    assert (
        client_of(creator).put(files_url(model, "f"), b"x", content_type="application/octet-stream").status_code == 404
    )
    allowed = send(creator, "GET", f"logged-models/{model['info']['model_id']}", {"allow_deleted": "true"})
    assert allowed.status_code == 200


def test_a_run_token_reaches_only_the_files_of_its_runs_models(model, creator, project, run):
    other = RunFactory(project=project, created_by=creator)
    for token_run, status in ((other, 403), (run, 200)):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {run_token(token_run, creator).key}")
        assert client.put(files_url(model, "w"), b"x", content_type="application/octet-stream").status_code == status
