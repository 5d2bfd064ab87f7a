"""The stock clients' checkpoint layouts on the wire: a Lightning ``<stem>/<stem>.ckpt`` of a Run and the
``checkpoint-N`` directory of a Hugging Face logged model become Checkpoints at their step; hostile names stay plain
artifacts or are refused, and nothing stored is lost (docs/design/checkpoints.md#mlflow-checkpoints)."""

import hashlib

import pytest

from checkpoints.models import Artifact, Checkpoint, CheckpointDeletion, CheckpointState, StorageUsage
from checkpoints.services.deletion import checkpoints_delete
from mlflow_api.artifacts.checkpoint_files import UNFINALIZED
from mlflow_api.artifacts.checkpoint_layouts import LIGHTNING, STEP_FOLDER, TRANSFORMERS, checkpoint_file_in
from runs.models import RunKind, RunStatus
from runs.services import run_set_status
from tests.factories import RunFactory
from tests.mlflow_api.test_mlflow_artifacts import bearer, put
from tests.mlflow_api.test_mlflow_logged_models_api import create, files_url, send

pytestmark = pytest.mark.django_db
HF_FILES = {"config.json": b"{}", "model.safetensors": b"w" * 300, "optimizer.pt": b"adam", "sub/rng.pth": b"r"}


# --- The recogniser: path -> (layout, step, path inside) -----------------------------------------------------------


@pytest.mark.parametrize(
    "path, model_name, expected",
    [
        ("checkpoints/step-100/nested/model.pt", None, (STEP_FOLDER, 100, "nested/model.pt")),
        ("artifacts/checkpoint-5/model.safetensors", "checkpoint-5", (TRANSFORMERS, 5, "model.safetensors")),
        ("artifacts/checkpoint-0/a/b.bin", "checkpoint-0", (TRANSFORMERS, 0, "a/b.bin")),
        ("epoch=0-step=5/epoch=0-step=5.ckpt", None, (LIGHTNING, 5, "epoch=0-step=5.ckpt")),
        ("step=12/step=12.ckpt", None, (LIGHTNING, 12, "step=12.ckpt")),
        ("epoch=1-step=00040/epoch=1-step=00040.ckpt", None, (LIGHTNING, 40, "epoch=1-step=00040.ckpt")),
        ("epoch=0-step=5-v1/epoch=0-step=5-v1.ckpt", None, (LIGHTNING, 5, "epoch=0-step=5-v1.ckpt")),
        ("best-epoch=2-step=30-val_loss=0.12/best-epoch=2-step=30-val_loss=0.12.ckpt", None, (LIGHTNING, 30, None)),
    ],
)
def test_the_stock_layouts_are_recognised_at_their_step(path, model_name, expected):
    found = checkpoint_file_in(path, model_name=model_name)
    layout, step, inner = expected
    assert (found.layout, found.step) == (layout, step)
    assert found.path == (inner or path.rsplit("/", 1)[1])


@pytest.mark.parametrize(
    "path, model_name",
    [
        ("artifacts/checkpoint-05/model.safetensors", "checkpoint-05"),  # HF never pads
        ("artifacts/checkpoint--5/model.safetensors", "checkpoint--5"),
        ("artifacts/checkpoint-+5/model.safetensors", "checkpoint-+5"),
        ("artifacts/checkpoint-1e3/model.safetensors", "checkpoint-1e3"),
        ("artifacts/checkpoint-/model.safetensors", "checkpoint-"),
        ("artifacts/checkpoint-1000000000000000000/x", "checkpoint-1000000000000000000"),  # 19 digits
        ("artifacts/checkpoint-99999999999999999999999/x", "checkpoint-99999999999999999999999"),
        ("artifacts/checkpoint-5/model.safetensors", "checkpoint-6"),  # not the model's own directory
        ("artifacts/checkpoint-5/model.safetensors", "net"),
        ("checkpoint-5/model.safetensors", "checkpoint-5"),
        ("MLmodel", "checkpoint-5"),
        ("artifacts/checkpoint-5", "checkpoint-5"),
        ("artifacts/checkpoint-5/model.safetensors", None),  # a Run's file, not a logged model's
        ("checkpoints/step-5/model.pt", "checkpoint-5"),  # the step folder is a Run's layout
        ("checkpoints/step-05/model.pt", None),
        ("checkpoints/step--1/model.pt", None),
        ("epoch=0-step=5/epoch=0-step=6.ckpt", None),  # the folder is not the file's stem
        ("epoch=0-step=5/metadata.yaml", None),
        ("epoch=0-step=5/aliases.txt", None),
        ("step=5-step=6/step=5-step=6.ckpt", None),  # two steps: which one?
        ("step=-5/step=-5.ckpt", None),
        ("step=/step=.ckpt", None),
        ("step=5x/step=5x.ckpt", None),
        ("xstep=5/xstep=5.ckpt", None),
        ("global_step=5/global_step=5.ckpt", None),
        ("step=1234567890123456789/step=1234567890123456789.ckpt", None),
        ("step=5.ckpt", None),
        ("a/step=5/step=5.ckpt", None),
        ("step=5/step=5.ckpt", "checkpoint-5"),  # a logged model's file
    ],
)
def test_other_names_are_plain_artifacts(path, model_name):
    assert checkpoint_file_in(path, model_name=model_name) is None


# --- Lightning: MLFlowLogger's log_artifact(<dir>/<stem>.ckpt, <stem>) ---------------------------------------------


def _manifest(checkpoint) -> dict[str, str]:
    return dict(checkpoint.manifest.values_list("path", "sha256"))


def test_a_lightning_ckpt_is_a_complete_checkpoint_at_its_step_and_its_metadata_stays_plain(creator, run):
    client = bearer(creator)
    assert put(client, run, "epoch=0-step=5/epoch=0-step=5.ckpt", b"state-5").status_code == 200
    assert put(client, run, "epoch=0-step=5/metadata.yaml", b"score: null\n").status_code == 200
    assert put(client, run, "epoch=0-step=5/aliases.txt", b"['latest']").status_code == 200
    checkpoint = Checkpoint.objects.get(run=run)
    assert (checkpoint.step, checkpoint.state, checkpoint.framework) == (5, CheckpointState.COMPLETE, "lightning")
    assert _manifest(checkpoint) == {"epoch=0-step=5.ckpt": hashlib.sha256(b"state-5").hexdigest()}
    assert Artifact.objects.filter(run=run).count() == 3

    assert put(client, run, "epoch=0-step=5/epoch=0-step=5.ckpt", b"state-5").status_code == 200  # a retry
    assert put(client, run, "epoch=0-step=5/aliases.txt", b"['latest', 'best']").status_code == 200  # MLflow's rule
    changed = put(client, run, "epoch=0-step=5/epoch=0-step=5.ckpt", b"other")
    assert changed.status_code == 409 and changed.json()["error_code"] == "RESOURCE_ALREADY_EXISTS"
    assert "step 5" in changed.json()["message"]
    stored = Artifact.objects.get(run=run, path="epoch=0-step=5/epoch=0-step=5.ckpt")
    assert stored.sha256 == hashlib.sha256(b"state-5").hexdigest() and stored.history == []
    assert Checkpoint.objects.get(run=run).file_count == 1


def test_a_lightning_step_that_can_no_longer_change_keeps_the_file_as_a_plain_artifact(creator, run):
    """The stock logger goes on training: a second file of a complete step, or a lower step, is stored, not joined."""
    client = bearer(creator)
    assert put(client, run, "epoch=0-step=10/epoch=0-step=10.ckpt", b"ten").status_code == 200
    assert put(client, run, "epoch=0-step=10-v1/epoch=0-step=10-v1.ckpt", b"ten again").status_code == 200
    assert put(client, run, "epoch=0-step=5/epoch=0-step=5.ckpt", b"five").status_code == 200
    assert list(Checkpoint.objects.filter(run=run).values_list("step", "file_count")) == [(10, 1)]
    assert Artifact.objects.filter(run=run).count() == 3


def test_an_evaluation_run_keeps_lightning_files_plain(creator, project):
    run = RunFactory(project=project, created_by=creator, kind=RunKind.EVALUATION)
    assert put(bearer(creator), run, "epoch=0-step=5/epoch=0-step=5.ckpt", b"x").status_code == 200
    assert not Checkpoint.objects.exists() and Artifact.objects.filter(run=run).count() == 1


def test_hostile_names_are_refused_or_plain_and_lose_nothing(creator, run):
    client = bearer(creator)
    assert put(client, run, "epoch=0-step=5/epoch=0-step=5.ckpt", b"five").status_code == 200
    for path in (
        "epoch=0-step=5/../epoch=0-step=5.ckpt",
        "epoch=0-step=5//epoch=0-step=5.ckpt",
        "./step=1/step=1.ckpt",
    ):
        assert put(client, run, path, b"evil").status_code == 400, path
    for path in ("step=-1/step=-1.ckpt", "step=99999999999999999999/step=99999999999999999999.ckpt"):
        assert put(client, run, path, b"plain").status_code == 200, path
    assert put(client, run, "checkpoints/step-99999999999999999999/x", b"plain").status_code == 200
    assert list(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [5]
    assert _manifest(Checkpoint.objects.get(run=run)) == {"epoch=0-step=5.ckpt": hashlib.sha256(b"five").hexdigest()}
    assert Artifact.objects.filter(run=run).count() == 4


# --- Hugging Face: MLflowCallback's pyfunc.log_model("checkpoint-N", artifacts={"model_path": <dir>}) ---------------


def _hf_save(user, project, run, step, files=HF_FILES, *, name=None, status="LOGGED_MODEL_READY"):
    """What ``MLflowCallback.on_save`` sends: a logged model of ``run``, its files, then the finalize."""
    model = create(user, project, name=name or f"checkpoint-{step}", source_run_id=run.external_id)
    client = bearer(user)
    uploads = {"MLmodel": b"flavors: {}", "python_model.pkl": b"pickle"}
    uploads.update({f"artifacts/checkpoint-{step}/{path}": data for path, data in files.items()})
    for path, data in uploads.items():
        response = client.put(files_url(model, path), data=data, content_type="application/octet-stream")
        assert response.status_code == 200, (path, response.content)
    if status:
        assert send(user, "PATCH", f"logged-models/{model['info']['model_id']}", {"status": status}).status_code == 200
    return model


def test_a_hf_checkpoint_directory_becomes_the_checkpoint_when_its_model_is_ready(creator, project, run):
    model = _hf_save(creator, project, run, 5, status=None)
    checkpoint = Checkpoint.objects.get(run=run)
    assert (checkpoint.step, checkpoint.state, checkpoint.framework) == (5, CheckpointState.PENDING, "transformers")
    assert _manifest(checkpoint) == {path: hashlib.sha256(data).hexdigest() for path, data in HF_FILES.items()}
    assert checkpoint.includes_optimizer and checkpoint.total_bytes == sum(map(len, HF_FILES.values()))
    model_id = model["info"]["model_id"]
    assert send(creator, "PATCH", f"logged-models/{model_id}", {"status": "LOGGED_MODEL_READY"}).status_code == 200
    assert Checkpoint.objects.get(run=run).state == CheckpointState.COMPLETE
    # the model's own files and the checkpoint's are all there for the MLflow client
    listed = send(creator, "GET", f"logged-models/{model_id}/artifacts/directories").json()["files"]
    assert {entry["path"] for entry in listed} == {"MLmodel", "python_model.pkl", "artifacts"}


def test_an_upload_failure_ends_the_hf_checkpoint_in_error(creator, project, run):
    _hf_save(creator, project, run, 5, status="LOGGED_MODEL_UPLOAD_FAILED")
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.state == CheckpointState.ERROR and "failed" in checkpoint.error


def test_deleting_a_hf_checkpoint_in_error_frees_its_files_and_says_how_many_bytes(admin, creator, project, run):
    _hf_save(creator, project, run, 5, status="LOGGED_MODEL_UPLOAD_FAILED")
    checkpoint = Checkpoint.objects.get(run=run)
    size = sum(map(len, HF_FILES.values()))

    def stored_files() -> tuple[int, int]:
        usage = StorageUsage.objects.filter(project=project, kind=StorageUsage.Kind.CHECKPOINT_FILES)
        return sum(u.bytes for u in usage), sum(u.files for u in usage)

    assert checkpoint.state == CheckpointState.ERROR and stored_files() == (size, len(HF_FILES))
    outcome = checkpoints_delete(actor=admin, project=project, checkpoint_ids=[checkpoint.pk], cause="hand")
    assert [c.pk for c in outcome.deleted] == [checkpoint.pk] and outcome.bytes == size
    assert CheckpointDeletion.objects.get(checkpoint_id=checkpoint.pk).bytes == size
    assert stored_files() == (0, 0) and not Artifact.objects.filter(path__contains="checkpoint-5/").exists()


@pytest.mark.parametrize("then", ["higher step", "run end"])
def test_a_hf_checkpoint_whose_model_was_never_finalized_is_never_complete(creator, project, run, then):
    """Only the model's READY says every file arrived: a save cut off mid-upload must not become resumable."""
    _hf_save(creator, project, run, 5, {"model.safetensors": b"half"}, status=None)
    if then == "higher step":
        _hf_save(creator, project, run, 10)
    else:
        run_set_status(actor=creator, run=run, status=RunStatus.FAILED)
    states = {c.step: (c.state, c.error) for c in Checkpoint.objects.filter(run=run)}
    assert states.pop(5) == (CheckpointState.ERROR, UNFINALIZED)
    assert states == ({10: (CheckpointState.COMPLETE, "")} if then == "higher step" else {})


def test_step_folder_and_hf_checkpoints_of_one_run_each_close_by_their_own_rule(creator, project, run):
    assert put(bearer(creator), run, "checkpoints/step-3/model.pt", b"three").status_code == 200
    _hf_save(creator, project, run, 5, status=None)  # starting step 5 completes the step folder's 3
    run_set_status(actor=creator, run=run, status=RunStatus.FINISHED)
    states = dict(Checkpoint.objects.filter(run=run).values_list("step", "state"))
    assert states == {3: CheckpointState.COMPLETE, 5: CheckpointState.ERROR}


def test_a_second_hf_save_of_a_complete_step_stays_plain_files_of_its_model(creator, project, run):
    _hf_save(creator, project, run, 5)
    again = _hf_save(creator, project, run, 5, {"model.safetensors": b"other weights"})
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.state == CheckpointState.COMPLETE and checkpoint.file_count == len(HF_FILES)
    assert Artifact.objects.filter(logged_model__model_id=again["info"]["model_id"]).count() == 3


@pytest.mark.parametrize(
    "name, where",
    [("checkpoint-05", "checkpoint-05"), ("net", "checkpoint-5"), ("checkpoint-6", "checkpoint-5")],
)
def test_a_model_whose_name_is_not_its_checkpoint_directory_keeps_plain_files(creator, project, run, name, where):
    model = create(creator, project, name=name, source_run_id=run.external_id)
    url = files_url(model, f"artifacts/{where}/model.safetensors")
    assert bearer(creator).put(url, data=b"w", content_type="application/octet-stream").status_code == 200
    assert not Checkpoint.objects.exists() and Artifact.objects.filter(logged_model__isnull=False).count() == 1


@pytest.mark.parametrize("kind", [RunKind.EVALUATION, None])
def test_a_hf_model_of_an_evaluation_run_or_of_no_run_keeps_plain_files(creator, project, kind):
    fields = {"name": "checkpoint-5"}
    if kind is not None:
        fields["source_run_id"] = RunFactory(project=project, created_by=creator, kind=kind).external_id
    model = create(creator, project, **fields)
    url = files_url(model, "artifacts/checkpoint-5/model.safetensors")
    assert bearer(creator).put(url, data=b"w", content_type="application/octet-stream").status_code == 200
    assert not Checkpoint.objects.exists()


def test_a_hf_checkpoint_file_is_neither_replaced_nor_deleted_through_its_model(admin, creator, project, run):
    model = _hf_save(creator, project, run, 5)
    url = files_url(model, "artifacts/checkpoint-5/model.safetensors")
    replaced = bearer(creator).put(url, data=b"tampered", content_type="application/octet-stream")
    assert replaced.status_code == 409 and "step 5" in replaced.json()["message"]
    assert bearer(admin).delete(url).status_code == 409
    stored = Artifact.objects.get(logged_model__model_id=model["info"]["model_id"], path__endswith="model.safetensors")
    assert stored.sha256 == hashlib.sha256(HF_FILES["model.safetensors"]).hexdigest() and stored.history == []
    assert (
        bearer(creator)
        .put(files_url(model, "MLmodel"), data=b"new", content_type="application/octet-stream")
        .status_code
        == 200
    )
