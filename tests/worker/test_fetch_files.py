"""Resuming a Job from a checkpoint stored file by file (MLflow ``log_artifacts(..., "checkpoints/step-N")``), in
process: each file fetched, verified against the manifest, written read-only
(docs/design/checkpoints.md#mlflow-checkpoints; docs/design/worker.md)."""

import io
import json

import pytest

from checkpoints import storage
from checkpoints.models import Checkpoint, ManifestEntry
from jobs.models import Job, JobStatus
from jobs.services import job_claim, job_finish, run_resume_from_checkpoint
from mlflow_api.artifacts.checkpoint_files import checkpoint_files_complete_for_run, mlflow_artifact_put
from tests.worker.helpers import FILES
from worker.tasks import run_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def files_checkpoint(launch, creator):
    """A Job whose code logged ``FILES`` MLflow-style at step 30, then failed; its checkpoint is complete."""
    job = launch()
    for path, data in FILES.items():
        mlflow_artifact_put(
            actor=creator,
            run=job.run,
            path=f"checkpoints/step-30/{path}",
            source=io.BytesIO(data),
            expected_size=len(data),
        )
    job_claim(job_id=job.pk, worker_host="earlier-worker")
    job_finish(job_id=job.pk, exit_code=1)
    checkpoint_files_complete_for_run(run_id=job.run_id)
    return Checkpoint.objects.get(run=job.run, step=30)


def test_a_job_resumes_from_a_files_checkpoint_read_only(files_checkpoint, creator, control, settings):
    marker = control()
    job = run_resume_from_checkpoint(actor=creator, checkpoint=files_checkpoint)
    assert run_job(job.pk) == JobStatus.SUCCEEDED, Job.objects.get(pk=job.pk).error
    seen = json.loads(marker.read_text())
    workdir = settings.MADO_WORKER_WORKDIR / f"job-{job.pk}"
    assert seen["env"]["MMT_RESUME_CHECKPOINT_DIR"] == str(workdir / "checkpoint")
    assert seen["env"]["MMT_RESUME_STEP"] == "30"
    assert {path: data.encode("latin-1") for path, data in seen["files"].items()} == FILES
    assert seen["modes"] == {
        ".": "0o555",
        "optim": "0o555",
        "model.pt": "0o444",
        "empty.bin": "0o444",
        "optim/state.pt": "0o444",
    }
    info = seen["resume_file"]
    assert (info["checkpointId"], info["step"]) == (files_checkpoint.pk, 30)


def _stored_key(checkpoint, path):
    return ManifestEntry.objects.select_related("artifact").get(checkpoint=checkpoint, path=path).artifact.storage_key


def _overwrite(key, data):
    with open(storage.artifact_storage().path(key), "wb") as out:
        out.write(data)


@pytest.mark.parametrize(
    "tamper, what",
    [
        (lambda data: b"X" + data[1:], "sha256"),
        (lambda data: data + b"!", "size"),
    ],
)
def test_a_tampered_file_fails_the_job_before_the_code_starts(
    files_checkpoint, creator, control, settings, tamper, what
):
    marker = control()
    _overwrite(_stored_key(files_checkpoint, "model.pt"), tamper(FILES["model.pt"]))
    job = run_resume_from_checkpoint(actor=creator, checkpoint=files_checkpoint)
    assert run_job(job.pk) == JobStatus.FAILED
    error = Job.objects.get(pk=job.pk).error
    assert error.startswith(f"Checkpoint {files_checkpoint.pk} {what} mismatch: "), error
    assert "'model.pt'" in error and not marker.exists()
    assert not (settings.MADO_WORKER_WORKDIR / f"job-{job.pk}").exists()


def test_a_missing_file_fails_the_job(files_checkpoint, creator, control):
    marker = control()
    storage.artifact_storage().delete(_stored_key(files_checkpoint, "optim/state.pt"))
    job = run_resume_from_checkpoint(actor=creator, checkpoint=files_checkpoint)
    assert run_job(job.pk) == JobStatus.FAILED
    assert Job.objects.get(pk=job.pk).error.startswith(
        f"Checkpoint {files_checkpoint.pk} artifact mismatch: object missing"
    )
    assert not marker.exists()


def test_an_unsafe_manifest_path_is_refused(files_checkpoint, creator, control):
    marker = control()
    ManifestEntry.objects.filter(checkpoint=files_checkpoint, path="empty.bin").update(path="../escape")
    job = run_resume_from_checkpoint(actor=creator, checkpoint=files_checkpoint)
    assert run_job(job.pk) == JobStatus.FAILED
    assert Job.objects.get(pk=job.pk).error.startswith(f"Checkpoint {files_checkpoint.pk} path mismatch")
    assert not marker.exists()
