"""A stored checkpoint tar deleted, truncated, extended or altered is named by whichever reader touches it first
(download, ``mado checkpoint restore``, the worker, the scrubber): the checkpoint turns ``corrupt`` with the reason,
one ``checkpoint_corrupt`` event is sent, and every later read answers 410 with that reason, never a 500 or a body cut
short (docs/design/checkpoints.md#damage)."""

import os
import time

import pytest
from click.testing import CliRunner

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, CheckpointState
from checkpoints.services.scrub import checkpoint_scrub_pass
from jobs.services import run_resume_from_checkpoint
from mado_tracking.cli import main
from tests.factories import api_key
from tests.worker.helpers import stored_checkpoint
from worker.errors import CheckpointMismatch
from worker.execute import prepare


def _delete(path: str, size: int) -> str:
    os.remove(path)
    return "the tar: the stored object is missing"


def _truncate(path: str, size: int) -> str:
    os.truncate(path, size - 100)
    return f"the tar: the stored object is {size - 100} bytes, {size} were verified"


def _extend(path: str, size: int) -> str:
    with open(path, "ab") as stored:
        stored.write(b"appended")
    return f"the tar: the stored object is {size + 8} bytes, {size} were verified"


def _alter(path: str, size: int) -> str:
    with open(path, "r+b") as stored:  # one byte flipped inside a member's data, as a failing disk would
        stored.seek(700)
        byte = stored.read(1)
        stored.seek(700)
        stored.write(bytes([byte[0] ^ 0xFF]))
    return "the tar: the stored object's SHA-256 is "


DAMAGE = {"deleted": _delete, "truncated": _truncate, "extended": _extend, "altered": _alter}


@pytest.fixture
def damaged(failed_source_job, request):
    """``damaged(kind)``: a complete checkpoint of the failed Job's Run whose stored tar was then damaged; returns
    ``(checkpoint, the start of the reason every reader must give)``."""

    def make(kind: str) -> tuple[Checkpoint, str]:
        checkpoint = stored_checkpoint(failed_source_job.run, 20)
        path = storage.artifact_storage().path(checkpoint.artifact.storage_key)
        return checkpoint, DAMAGE[kind](path, checkpoint.tar_size)

    return make


def assert_named_once(checkpoint: Checkpoint, reason: str, corrupt_events: list) -> str:
    checkpoint.refresh_from_db()
    assert checkpoint.state == CheckpointState.CORRUPT
    assert checkpoint.error.startswith(reason), checkpoint.error
    assert corrupt_events == [(checkpoint.pk, checkpoint.error)], "one checkpoint_corrupt event, with the reason"
    return checkpoint.error


def assert_later_downloads_refuse(api, member, checkpoint: Checkpoint, error: str, corrupt_events: list) -> None:
    again = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert again.status_code == 410 and again.json()["error"] == "checkpoint_corrupt"
    assert again.json()["detail"] == f"checkpoint {checkpoint.pk} is corrupt: {error}"
    assert len(corrupt_events) == 1, "a later read sends no second event"


@pytest.mark.django_db
@pytest.mark.parametrize("kind", DAMAGE)
def test_a_download_names_it_before_any_byte(
    kind, damaged, api, member, corrupt_events, django_capture_on_commit_callbacks
):
    checkpoint, reason = damaged(kind)
    with django_capture_on_commit_callbacks(execute=True):
        answer = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert answer.status_code == 410 and answer["Content-Type"] == "application/json"
    assert answer.json()["error"] == "checkpoint_corrupt" and reason in answer.json()["detail"]
    error = assert_named_once(checkpoint, reason, corrupt_events)
    assert_later_downloads_refuse(api, member, checkpoint, error, corrupt_events)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", DAMAGE)
def test_the_worker_names_it(
    kind, damaged, api, member, creator, corrupt_events, tmp_path, django_capture_on_commit_callbacks
):
    checkpoint, reason = damaged(kind)
    job = run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint)
    workdir = tmp_path / "job"
    workdir.mkdir()
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(CheckpointMismatch):
        prepare(job, workdir, lambda: None)
    assert not (workdir / "checkpoint").exists()
    error = assert_named_once(checkpoint, reason, corrupt_events)
    assert_later_downloads_refuse(api, member, checkpoint, error, corrupt_events)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", DAMAGE)
def test_the_scrubber_names_it(kind, damaged, api, member, corrupt_events, django_capture_on_commit_callbacks):
    checkpoint, reason = damaged(kind)
    with django_capture_on_commit_callbacks(execute=True):
        outcome = checkpoint_scrub_pass(rate=10**12)
    assert checkpoint.pk in outcome.corrupt
    error = assert_named_once(checkpoint, reason, corrupt_events)
    assert_later_downloads_refuse(api, member, checkpoint, error, corrupt_events)


@pytest.mark.parametrize("kind", DAMAGE)
def test_mado_checkpoint_restore_names_it(kind, damaged, api, member, corrupt_events, live_server, tmp_path):
    checkpoint, reason = damaged(kind)
    env = {"MMT_API_URL": live_server.url, "MMT_API_TOKEN": api_key(member), "MMT_CONFIG_DIR": str(tmp_path / "cfg")}
    into = tmp_path / "restored"
    done = CliRunner().invoke(main, ["checkpoint", "restore", str(checkpoint.pk), "--into", str(into)], env=env)
    assert done.exit_code == 1, done.output
    assert f"checkpoint {checkpoint.pk} is corrupt: {reason}" in done.output
    assert "HTTP 500" not in done.output and not into.exists()
    error = assert_named_once(checkpoint, reason, corrupt_events)
    again = CliRunner().invoke(main, ["checkpoint", "restore", str(checkpoint.pk), "--into", str(into)], env=env)
    assert again.exit_code == 1 and f"checkpoint {checkpoint.pk} is corrupt: {error}" in again.output
    assert len(corrupt_events) == 1


@pytest.mark.django_db
def test_an_intact_tar_is_read_back_once_then_trusted_until_it_is_rewritten(
    failed_source_job, api, member, corrupt_events, django_capture_on_commit_callbacks
):
    checkpoint = stored_checkpoint(failed_source_job.run, 20)
    path = storage.artifact_storage().path(checkpoint.artifact.storage_key)
    settled = time.time() - 60
    os.utime(path, (settled, settled))  # written a minute ago: a stat now tells any later rewrite apart
    first = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert first.status_code == 200 and b"".join(first.streaming_content)
    assert Artifact.objects.get(pk=checkpoint.artifact_id).stored_fingerprint, "the matching read is remembered"
    reason = _alter(path, checkpoint.tar_size)  # the rewrite changes the file's modification time
    with django_capture_on_commit_callbacks(execute=True):
        second = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert second.status_code == 410 and reason in second.json()["detail"]
    assert_named_once(checkpoint, reason, corrupt_events)


@pytest.mark.django_db
def test_a_damaged_file_of_no_checkpoint_answers_410_not_500(failed_source_job, api, creator):
    run = failed_source_job.run
    client = api(creator)
    stored = client.put(
        f"/api/v1/runs/{run.pk}/artifacts/notes/eval.json", b'{"acc": 0.9}', content_type="application/octet-stream"
    )
    assert stored.status_code == 201, stored.content
    os.remove(storage.artifact_storage().path(Artifact.objects.get(run=run, path="notes/eval.json").storage_key))
    answer = client.get(f"/api/v1/runs/{run.pk}/artifacts/notes/eval.json")
    assert answer.status_code == 410 and answer.json()["error"] == "artifact_damaged"
    assert "notes/eval.json: the stored object is missing" in answer.json()["detail"]


@pytest.mark.django_db
def test_a_storage_not_mounted_is_an_outage_not_damage(failed_source_job, api, member, settings, corrupt_events):
    checkpoints = [stored_checkpoint(failed_source_job.run, step) for step in (20, 21)]
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    os.rename(root, f"{root}.away")
    os.mkdir(root)  # what an unmounted volume's mount point looks like: an empty directory
    answer = api(member).get(f"/api/v1/checkpoints/{checkpoints[0].pk}/tar")
    assert answer.status_code == 503 and answer.json()["error"] == "unavailable"
    assert checkpoint_scrub_pass(rate=10**12).corrupt == []
    os.rmdir(root)
    answer = api(member).get(f"/api/v1/checkpoints/{checkpoints[1].pk}/tar")  # the root itself gone
    assert answer.status_code == 503
    assert {c.state for c in Checkpoint.objects.all()} == {CheckpointState.COMPLETE} and corrupt_events == []
    os.rename(f"{root}.away", root)  # mounted again: everything is there
    assert api(member).get(f"/api/v1/checkpoints/{checkpoints[0].pk}/tar").status_code == 200


@pytest.mark.django_db
def test_a_file_system_that_refuses_the_read_is_an_outage(failed_source_job, api, member, monkeypatch, corrupt_events):
    checkpoint = stored_checkpoint(failed_source_job.run, 20)
    path = storage.artifact_storage().path(checkpoint.artifact.storage_key)
    real_stat = os.stat

    def refusing(target, *args, **kwargs):
        if os.fspath(target) == path:
            raise OSError(5, "Input/output error", path)  # EIO, as a failing NFS mount answers
        return real_stat(target, *args, **kwargs)

    monkeypatch.setattr(storage.os, "stat", refusing)
    answer = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert answer.status_code == 503 and answer.json()["error"] == "unavailable"
    checkpoint.refresh_from_db()
    assert checkpoint.state == CheckpointState.COMPLETE and corrupt_events == []


@pytest.mark.django_db
def test_no_file_of_a_corrupt_checkpoint_is_downloaded_by_any_path(
    failed_source_job, api, member, django_capture_on_commit_callbacks
):
    checkpoint, reason = _damaged_now(failed_source_job)
    with django_capture_on_commit_callbacks(execute=True):
        assert api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar").status_code == 410
    checkpoint.refresh_from_db()
    as_file = api(member).get(f"/api/v1/runs/{checkpoint.run_id}/artifacts/{checkpoint.artifact.path}")
    assert as_file.status_code == 410 and as_file.json()["error"] == "checkpoint_corrupt"
    assert as_file.json()["detail"] == f"checkpoint {checkpoint.pk} is corrupt: {checkpoint.error}"


def _damaged_now(job) -> tuple[Checkpoint, str]:
    checkpoint = stored_checkpoint(job.run, 20)
    path = storage.artifact_storage().path(checkpoint.artifact.storage_key)
    return checkpoint, _alter(path, checkpoint.tar_size)


@pytest.mark.django_db
def test_ranged_reads_after_the_first_byte_only_stat_so_parallel_parts_read_the_object_back_once(
    failed_source_job, api, member, monkeypatch
):
    checkpoint = stored_checkpoint(failed_source_job.run, 20)
    reads = []
    real = storage.blob_stat
    monkeypatch.setattr(storage, "blob_stat", lambda key, **kw: reads.append(key) or real(key, **kw))
    client = api(member)
    for first in (4096, 1024, 0):
        answer = client.get(f"/api/v1/checkpoints/{checkpoint.pk}/tar", HTTP_RANGE=f"bytes={first}-")
        assert answer.status_code == 206
    assert reads == [checkpoint.artifact.storage_key], "one read back: the part from the first byte"
    _alter(storage.artifact_storage().path(checkpoint.artifact.storage_key), checkpoint.tar_size)
    assert client.get(f"/api/v1/checkpoints/{checkpoint.pk}/tar", HTTP_RANGE="bytes=0-99").status_code == 410
