"""The stock MLflow client saving a checkpoint folder whose names the checkpoint format refuses: the upload is
refused in MLflow's error shape naming the file and the rule, and the checkpoint ends ``error`` instead of
completing, so no restore finds it later; an oversized MLflow JSON body answers MLflow's JSON error
(docs/design/checkpoints.md#names, docs/api.md)."""

import json
import unicodedata

import pytest

mlflow = pytest.importorskip("mlflow")

from checkpoints.models import Checkpoint, CheckpointState  # noqa: E402
from runs.models import Run  # noqa: E402
from tests.factories import RunFactory, api_key  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

STEP = "checkpoints/step-7"


def _write(root, relative: str, data: bytes = b"weights") -> None:
    target = root.joinpath(*relative.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _device_name(tmp_path):
    _write(tmp_path / "ckpt", "aux.pt")
    mlflow.log_artifacts(str(tmp_path / "ckpt"), STEP)


def _case_clash(tmp_path):
    _write(tmp_path / "one", "Model.pt")
    _write(tmp_path / "two", "model.pt")
    mlflow.log_artifacts(str(tmp_path / "one"), STEP)
    mlflow.log_artifacts(str(tmp_path / "two"), STEP)


def _nfc_nfd_clash(tmp_path):
    _write(tmp_path / "ckpt", unicodedata.normalize("NFC", "café.pt"))
    _write(tmp_path / "ckpt", unicodedata.normalize("NFD", "café.pt"))
    mlflow.log_artifacts(str(tmp_path / "ckpt"), STEP)


def _file_and_directory(tmp_path):
    _write(tmp_path / "one", "model")
    _write(tmp_path / "two", "model/a.bin")
    mlflow.log_artifacts(str(tmp_path / "one"), STEP)
    mlflow.log_artifacts(str(tmp_path / "two"), STEP)


def _trailing_dot(tmp_path):
    _write(tmp_path / "ckpt", "model.")
    mlflow.log_artifacts(str(tmp_path / "ckpt"), STEP)


def _long_component(tmp_path):
    _write(tmp_path / "ckpt", "model.pt")  # a name of 256 bytes: a folder no Linux file system holds, so the path
    mlflow.log_artifacts(str(tmp_path / "ckpt"), f"{STEP}/{'x' * 256}")


def _too_deep(tmp_path):
    _write(tmp_path / "ckpt", "/".join(["d"] * 65 + ["model.pt"]))  # 66 levels inside the checkpoint
    mlflow.log_artifacts(str(tmp_path / "ckpt"), STEP)


@pytest.mark.parametrize(
    ("save", "named", "rule"),
    [
        (_device_name, "aux.pt", "is a device name on Windows"),
        (_case_clash, "'model.pt'", "collides with 'Model.pt'"),
        (_nfc_nfd_clash, "caf", "same name once normalised or case-folded"),
        (_file_and_directory, "'model'", "as a directory, but it is a file"),
        (_trailing_dot, "'model.'", "ends with a dot or a space"),
        (_long_component, "x" * 40, "longer than 255 bytes"),
        (_too_deep, "d/d/d", "deeper than 64 levels"),
    ],
    ids=["device-name", "case", "nfc-nfd", "file-and-directory", "trailing-dot", "256-byte-name", "66-levels"],
)
def test_a_checkpoint_folder_with_a_name_restore_refuses_is_refused_and_never_completes(
    mlflow_env, tmp_path, project, save, named, rule
):
    mlflow.set_experiment(experiment_id=str(project.pk))
    with pytest.raises(Exception) as refused:
        with mlflow.start_run() as active:
            save(tmp_path)
    message = str(refused.value)
    assert "400" in message and "INVALID_PARAMETER_VALUE" in message, message
    assert named in message and rule in message, message
    run = Run.objects.get(external_id=active.info.run_id)
    (checkpoint,) = Checkpoint.objects.filter(run=run)
    assert checkpoint.step == 7
    assert checkpoint.state == CheckpointState.ERROR  # the Run ended (failed): still never complete
    assert rule in checkpoint.error
    assert mlflow.active_run() is None


def test_the_good_files_of_the_same_folder_never_form_a_partial_checkpoint(mlflow_env, tmp_path, project):
    """A later upload of the step's other files (a retry of the same folder without the bad file) is refused too:
    the step's checkpoint ended ``error`` with the refusal; a later step still saves."""
    mlflow.set_experiment(experiment_id=str(project.pk))
    _write(tmp_path / "bad", "weights.pt")
    _write(tmp_path / "bad", "nul.txt")
    _write(tmp_path / "good", "weights.pt")
    with mlflow.start_run() as active:
        with pytest.raises(Exception, match="device name on Windows"):
            mlflow.log_artifacts(str(tmp_path / "bad"), STEP)
        with pytest.raises(Exception, match="is error; it can no longer change"):
            mlflow.log_artifacts(str(tmp_path / "good"), STEP)
        mlflow.log_artifacts(str(tmp_path / "good"), "checkpoints/step-8")
    states = dict(Checkpoint.objects.filter(run__external_id=active.info.run_id).values_list("step", "state"))
    assert states == {7: CheckpointState.ERROR, 8: CheckpointState.COMPLETE}


@pytest.mark.parametrize(
    "endpoint",
    [
        "/api/2.0/mlflow/runs/log-batch",
        "/api/2.0/mlflow/runs/create",
        "/mlflow/api/2.0/mlflow/experiments/create",
        "/api/2.0/mlflow/registered-models/create",
    ],
)
def test_an_oversized_mlflow_json_body_answers_mlflows_json_error(client, member, settings, endpoint):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 65_536
    body = json.dumps({"run_id": "r", "params": [{"key": f"k{i}", "value": "v" * 100} for i in range(1000)]})
    answer = client.post(
        endpoint, data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {api_key(member)}"
    )
    assert answer.status_code == 413
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "larger than 65536 bytes" in answer.json()["message"]


def test_an_oversized_body_to_the_artifact_proxys_json_endpoint_answers_mlflows_json_error(
    client, member, settings, project, monkeypatch
):
    from checkpoints import storage

    monkeypatch.setattr(storage, "s3_storage", lambda: object())  # multipart answers only on S3
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 65_536
    run = RunFactory(project=project, created_by=member)
    body = json.dumps({"path": "x", "num_parts": 1, "pad": "x" * 70_000})
    answer = client.post(
        f"/api/2.0/mlflow-artifacts/mpu/create/{project.pk}/{run.external_id}/artifacts/x.bin",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_key(member)}",
    )
    assert answer.status_code == 413, answer.content
    assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"


# --- The stock integrations' layouts, on the wire: the same one checker (docs/design/checkpoints.md#names) ----------


def test_a_hugging_face_checkpoint_file_whose_name_clashes_is_refused_and_its_checkpoint_ends_error(
    creator, project, run
):
    from tests.mlflow_api.test_mlflow_artifacts import bearer
    from tests.mlflow_api.test_mlflow_logged_models_api import create, files_url, send

    model = create(creator, project, name="checkpoint-5", source_run_id=run.external_id)
    client = bearer(creator)

    def put(path):
        return client.put(files_url(model, path), data=b"{}", content_type="application/octet-stream")

    assert put("artifacts/checkpoint-5/config.json").status_code == 200
    refused = put("artifacts/checkpoint-5/CONFIG.json")
    assert refused.status_code == 400, refused.content
    assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "'CONFIG.json' collides with 'config.json'" in refused.json()["message"]
    checkpoint = Checkpoint.objects.get(run=run, step=5)
    assert checkpoint.state == CheckpointState.ERROR and checkpoint.file_count == 1
    finalized = send(creator, "PATCH", f"logged-models/{model['info']['model_id']}", {"status": "LOGGED_MODEL_READY"})
    assert finalized.status_code == 200, finalized.content
    assert Checkpoint.objects.get(run=run, step=5).state == CheckpointState.ERROR  # READY completes nothing now


def test_a_lightning_checkpoint_with_a_name_over_255_bytes_is_refused_before_it_is_stored(creator, project, run):
    from checkpoints.models import Artifact
    from tests.mlflow_api.test_mlflow_artifacts import bearer, put

    stem = "epoch=0-step=9-" + "x" * 250
    refused = put(bearer(creator), run, f"{stem}/{stem}.ckpt", b"weights")
    assert refused.status_code == 400, refused.content
    assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "longer than 255 bytes" in refused.json()["message"]
    assert not Artifact.objects.filter(run=run).exists()
    assert Checkpoint.objects.get(run=run, step=9).state == CheckpointState.ERROR
