"""Checkpoint detection from MLflow uploads under ``checkpoints/step-<int>/`` and its completion triggers
(docs/design/checkpoints.md#mlflow-checkpoints, #deletion)."""

import hashlib

import pytest

from checkpoints.models import Artifact, Checkpoint, CheckpointLayout, CheckpointState
from mlflow_api.artifacts.checkpoint_files import checkpoint_files_complete_for_run
from runs.models import RunKind, RunStatus
from runs.services import run_set_status
from tests.factories import RunFactory
from tests.mlflow_api.test_mlflow_artifacts import bearer, put

pytestmark = pytest.mark.django_db
FILES = {"model.pt": b"weights" * 100, "nested/dir/optim.pt": b"optim", "empty.bin": b"", "with space.txt": b"hi"}


def upload(creator, run, step, files=FILES):
    for path, data in files.items():
        assert put(bearer(creator), run, f"checkpoints/step-{step}/{path}", data).status_code == 200


def test_files_under_a_step_folder_form_a_pending_checkpoint_with_server_digests(creator, run):
    upload(creator, run, 100)
    checkpoint = Checkpoint.objects.get(run=run, step=100)
    assert (checkpoint.layout, checkpoint.state) == (CheckpointLayout.FILES, CheckpointState.PENDING)
    assert checkpoint.file_count == 4 and checkpoint.total_bytes == sum(map(len, FILES.values()))
    manifest = {e.path: (e.size, e.sha256, e.artifact.path) for e in checkpoint.manifest.select_related("artifact")}
    assert manifest == {
        p: (len(d), hashlib.sha256(d).hexdigest(), f"checkpoints/step-100/{p}") for p, d in FILES.items()
    }


def test_uploading_the_same_file_again_changes_nothing(creator, run):
    upload(creator, run, 100)
    upload(creator, run, 100, {"model.pt": FILES["model.pt"]})
    assert Checkpoint.objects.get(run=run, step=100).file_count == 4


def test_a_higher_step_completes_the_lower_one(creator, run):
    upload(creator, run, 100)
    upload(creator, run, 200, {"model.pt": b"later"})
    states = dict(Checkpoint.objects.filter(run=run).values_list("step", "state"))
    assert states == {100: CheckpointState.COMPLETE, 200: CheckpointState.PENDING}


def test_the_run_ending_completes_pending_checkpoints(creator, run):
    upload(creator, run, 100)
    assert checkpoint_files_complete_for_run(run_id=run.pk) == 1
    assert Checkpoint.objects.get(run=run, step=100).is_usable
    assert checkpoint_files_complete_for_run(run_id=run.pk) == 0


def test_run_set_status_to_a_final_state_completes_pending_checkpoints(creator, run):
    upload(creator, run, 100)
    run_set_status(actor=creator, run=run, status=RunStatus.FINISHED)
    assert Checkpoint.objects.get(run=run, step=100).state == CheckpointState.COMPLETE


def test_a_complete_or_lower_step_refuses_new_files_and_stores_nothing(creator, run):
    upload(creator, run, 100)
    upload(creator, run, 200, {"model.pt": b"later"})
    before = Artifact.objects.count()
    for step in (100, 50):
        response = put(bearer(creator), run, f"checkpoints/step-{step}/extra.bin", b"x")
        assert response.status_code == 409 and response.json()["error_code"] == "RESOURCE_ALREADY_EXISTS"
    assert Artifact.objects.count() == before


def test_an_ended_run_refuses_checkpoint_files(creator, run):
    run.status = RunStatus.FINISHED
    run.save()
    assert put(bearer(creator), run, "checkpoints/step-1/model.pt", b"x").status_code == 409
    assert not Artifact.objects.exists()


def test_an_evaluation_run_stores_plain_files(creator, project):
    run = RunFactory(project=project, created_by=creator, kind=RunKind.EVALUATION)
    upload(creator, run, 100)
    assert not Checkpoint.objects.exists() and Artifact.objects.filter(run=run).count() == 4


def test_a_checkpoint_file_cannot_be_deleted_as_a_plain_artifact(admin, creator, run):
    upload(creator, run, 100)
    response = bearer(admin).delete(
        f"/api/2.0/mlflow-artifacts/artifacts/{run.project_id}/{run.external_id}"
        "/artifacts/checkpoints/step-100/model.pt"
    )
    assert response.status_code == 409
    assert Artifact.objects.filter(run=run).count() == 4


def test_deleting_a_files_checkpoint_removes_every_stored_file(
    settings, admin, creator, run, django_capture_on_commit_callbacks
):
    from checkpoints.services import checkpoint_delete
    from checkpoints.storage import artifact_storage

    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    upload(creator, run, 100)
    upload(creator, run, 200, {"model.pt": b"later"})
    upload(creator, run, 300, {"model.pt": b"latest"})  # completes 200, which the keep count of 1 then holds
    old = Checkpoint.objects.get(run=run, step=100)
    keys = [entry.artifact.storage_key for entry in old.manifest.select_related("artifact")]
    with django_capture_on_commit_callbacks(execute=True):
        deleted = checkpoint_delete(actor=admin, checkpoint=old)
    assert deleted.state == CheckpointState.DELETED
    assert not Artifact.objects.filter(run=run, path__startswith="checkpoints/step-100/").exists()
    assert not any(artifact_storage().exists(key) for key in keys)
    assert old.manifest.count() == len(FILES)  # the record of what it held stays
