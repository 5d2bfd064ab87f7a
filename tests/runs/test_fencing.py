"""Fencing tokens: after a takeover the old process cannot write anything (docs/design/runs.md#one-writer-process).

A Run resumed by a second process has a new fencing token; every write of
the first, which still sends the old one in ``Mado-Fencing-Token``, answers
409 ``lease_lost`` and stores nothing. A pending checkpoint the old process
left behind is taken over by the new one at the same step.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints.models import Artifact, Checkpoint, CheckpointState
from runs.models import DataStage, MetricPoint, Run, RunStatus
from tests.checkpoints.checkpoint_helpers import declaration, make_tar, put_tar
from tests.factories import DatasetFactory, DatasetVersionFactory, RunFactory

OLD, NEW = {"HTTP_MADO_FENCING_TOKEN": "1"}, {"HTTP_MADO_FENCING_TOKEN": "2"}
TAR = make_tar({"model.pt": b"weights"})


@pytest.fixture
def taken_over(api, project, creator):
    """Run exp-42 started by process 1 (token 1), then taken over by process 2 (token 2) after it stopped beating."""
    run = RunFactory(
        project=project,
        created_by=creator,
        external_id="exp-42",
        status=RunStatus.CRASHED,
        started_at=timezone.now() - timedelta(hours=1),
        lease_token=1,
        writer_host="old-host",
    )
    response = api(creator).post(
        "/api/v1/runs/",
        {"project": "vision", "external_id": "exp-42", "resume": "allow", "host": "new-host", "pid": 2},
        format="json",
    )
    assert response.status_code == 200 and response.json()["fencing_token"] == 2
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def client(api, creator):
    return api(creator)


def register(client, run, step: int, **headers):
    return client.post(f"/api/v1/runs/{run.pk}/checkpoints/", {"step": step}, format="json", **headers)


def complete(client, checkpoint_id: int, **headers):
    body = declaration(TAR, {"model.pt": b"weights"})
    return client.post(f"/api/v1/checkpoints/{checkpoint_id}/complete/", body, format="json", **headers)


def stored_files(tmp_path) -> list:
    root = tmp_path / "artifacts"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def assert_lease_lost(response):
    assert response.status_code == 409, response.content
    body = response.json()
    assert (body["error"], body["field"]) == ("lease_lost", "Mado-Fencing-Token")
    assert "new-host" in body["detail"] and "stale" in body["detail"]


# --- every fenced endpoint refuses the old token and stores nothing ------------------------


def test_metrics_from_the_old_process_are_refused(client, taken_over):
    points = {"points": [{"key": "loss", "value": 1.0, "step": 5}]}
    assert_lease_lost(client.post(f"/api/v1/runs/{taken_over.pk}/metrics/", points, format="json", **OLD))
    assert not MetricPoint.objects.filter(run=taken_over).exists()
    assert client.post(f"/api/v1/runs/{taken_over.pk}/metrics/", points, format="json", **NEW).status_code == 201
    assert client.post(f"/api/v1/runs/{taken_over.pk}/metrics/", points, format="json").status_code == 201, (
        "no header: not fenced"
    )


def test_a_bad_fencing_header_is_400_naming_it(client, taken_over):
    points = {"points": [{"key": "loss", "value": 1.0, "step": 5}]}
    response = client.post(f"/api/v1/runs/{taken_over.pk}/metrics/", points, format="json", HTTP_MADO_FENCING_TOKEN="x")
    assert (response.status_code, response.json()["field"]) == (400, "Mado-Fencing-Token")


def test_a_checkpoint_registration_from_the_old_process_is_refused(client, taken_over):
    assert_lease_lost(register(client, taken_over, 10, **OLD))
    assert not Checkpoint.objects.filter(run=taken_over).exists()
    created = register(client, taken_over, 10, **NEW)
    assert created.status_code == 201
    assert Checkpoint.objects.get(pk=created.json()["id"]).lease_token == 2


def test_a_tar_upload_from_the_old_process_is_refused_and_keeps_no_bytes(client, taken_over, tmp_path):
    checkpoint = Checkpoint.objects.create(run=taken_over, step=10, lease_token=2)
    assert_lease_lost(put_tar(client, checkpoint.pk, TAR, **OLD))
    checkpoint.refresh_from_db()
    assert checkpoint.received == {} and stored_files(tmp_path) == []
    assert put_tar(client, checkpoint.pk, TAR, **NEW).status_code == 200


def test_upload_parts_from_the_old_process_is_refused(client, taken_over):
    checkpoint = Checkpoint.objects.create(run=taken_over, step=10, lease_token=2)
    response = client.post(
        f"/api/v1/checkpoints/{checkpoint.pk}/upload-parts/", {"tar_size": 100}, format="json", **OLD
    )
    assert_lease_lost(response)
    checkpoint.refresh_from_db()
    assert checkpoint.received == {}


def test_completing_a_checkpoint_from_the_old_process_is_refused(client, taken_over):
    checkpoint = Checkpoint.objects.create(run=taken_over, step=10, lease_token=2)
    assert put_tar(client, checkpoint.pk, TAR, **NEW).status_code == 200
    assert_lease_lost(complete(client, checkpoint.pk, **OLD))
    checkpoint.refresh_from_db()
    assert checkpoint.state == CheckpointState.PENDING and not Artifact.objects.filter(run=taken_over).exists()
    assert complete(client, checkpoint.pk, **NEW).status_code == 200


def test_a_data_stage_from_the_old_process_is_refused(client, taken_over, project):
    version = DatasetVersionFactory(dataset=DatasetFactory(project=project))
    body = {"start_step": 20, "input_dataset_version_ids": [version.pk]}
    url = f"/api/v1/runs/{taken_over.pk}/data-stages/"
    assert_lease_lost(client.post(url, body, format="json", **OLD))
    assert not DataStage.objects.exists()
    assert client.post(url, body, format="json", **NEW).status_code == 201


def test_an_artifact_upload_from_the_old_process_is_refused_and_keeps_no_bytes(client, taken_over, tmp_path):
    url = f"/api/v1/runs/{taken_over.pk}/artifacts/logs/train.txt"
    assert_lease_lost(client.put(url, data=b"hello", content_type="application/octet-stream", **OLD))
    assert not Artifact.objects.exists() and stored_files(tmp_path) == []
    assert client.put(url, data=b"hello", content_type="application/octet-stream", **NEW).status_code == 201


# --- a pending checkpoint of the old process is taken over ---------------------------------


def old_pending(client, run, step: int) -> Checkpoint:
    """What process 1 left: a registered checkpoint at ``step`` whose tar arrived but that never completed."""
    Run.objects.filter(pk=run.pk).update(lease_token=1)
    created = register(client, run, step, **OLD)
    assert created.status_code == 201
    assert put_tar(client, created.json()["id"], TAR, **OLD).status_code == 200
    Run.objects.filter(pk=run.pk).update(lease_token=2)
    return Checkpoint.objects.get(pk=created.json()["id"])


def test_the_new_process_takes_over_the_old_pending_checkpoint_at_its_step(
    client, taken_over, tmp_path, django_capture_on_commit_callbacks
):
    old = old_pending(client, taken_over, 100)
    assert len(stored_files(tmp_path)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        created = register(client, taken_over, 100, **NEW)
    assert created.status_code == 201, created.content
    assert created.json()["id"] != old.pk and created.json()["state"] == "pending"
    assert not Checkpoint.objects.filter(pk=old.pk).exists()
    assert stored_files(tmp_path) == [], "the old upload's bytes are discarded"
    assert put_tar(client, old.pk, TAR, **OLD).status_code == 404, "the old process finds its checkpoint gone"
    assert put_tar(client, created.json()["id"], TAR, **NEW).status_code == 200
    assert complete(client, created.json()["id"], **NEW).status_code == 200


def test_a_complete_checkpoint_at_the_step_is_never_taken_over(client, taken_over):
    Checkpoint.objects.create(run=taken_over, step=100, state=CheckpointState.COMPLETE, lease_token=1)
    response = register(client, taken_over, 100, **NEW)
    assert response.status_code == 409 and response.json()["detail"] == "step 100 is already saved in this run"


def test_a_pending_checkpoint_of_the_same_writer_is_not_taken_over(client, taken_over):
    first = register(client, taken_over, 100, **NEW)
    assert first.status_code == 201
    response = register(client, taken_over, 100, **NEW)
    assert response.status_code == 409
    assert Checkpoint.objects.get(run=taken_over, step=100).pk == first.json()["id"]


def test_without_a_token_a_pending_checkpoint_is_not_taken_over(client, taken_over):
    Checkpoint.objects.create(run=taken_over, step=100, lease_token=1)
    assert register(client, taken_over, 100).status_code == 409
