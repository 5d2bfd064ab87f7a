"""A same-run resume brings its checkpoint (docs/design/resume.md#resume-anywhere): against a stub server that
serves real tars, the latest complete checkpoint is chosen, downloaded once, verified, cached read-only and
reused; a changed cache entry is replaced; ``MMT_RESUME_CHECKPOINT_ID`` may name it but never an older one (a run
cannot go back), and a bad one is refused before any request; a Job's
``MMT_RESUME_*`` variables still win; a process that starts below the checkpoint is told at its first call."""

import json
import logging
import os
import stat
import threading

import pytest

import mado_tracking
from mado_tracking import CheckpointError, ResumeError, checkpoint_cache
from mado_tracking.client import ApiClient
from mado_tracking.config import Config
from tests.sdk.resume_stub import ResumeStubApi, points_of


@pytest.fixture
def stub(tmp_path, monkeypatch):
    monkeypatch.setenv("MMT_CACHE_DIR", str(tmp_path / "cache"))
    with ResumeStubApi() as api:
        api.add_checkpoint(11, 10)
        api.add_checkpoint(12, 20)
        yield api


def _resume(stub, **kwargs):
    return mado_tracking.start_run(
        project="vision", api_url=stub.url, api_token="stub-token", id="exp-1", resume="must", **kwargs
    )


def _entry(tmp_path, stub, checkpoint_id: int):
    return checkpoint_cache.cache_dir(stub.url) / str(checkpoint_id)


def test_the_latest_complete_checkpoint_is_extracted_read_only_and_a_pending_newer_one_is_named(stub, tmp_path, caplog):
    stub.add_checkpoint(13, 30, state="pending")
    with caplog.at_level(logging.INFO, logger="mado_tracking"), _resume(stub) as run:
        assert (
            "run exp-1 has checkpoints up to step 20; call run.resume_checkpoint() to continue from it" in caplog.text
        )
        checkpoint = run.resume_checkpoint()
    assert (checkpoint.step, checkpoint.id, checkpoint.source_run_id) == (20, 12, 1)
    assert checkpoint.path == _entry(tmp_path, stub, 12) / "checkpoint"
    assert (checkpoint.path / "nested" / "model.bin").read_bytes() == b"weights at step 20" * 100
    assert stat.S_IMODE((checkpoint.path / "nested" / "model.bin").stat().st_mode) == 0o444
    assert stat.S_IMODE((checkpoint.path / "nested").stat().st_mode) == 0o555
    assert "checkpoint 13 at step 30 is pending (its upload never completed); resuming from step 20" in caplog.text
    assert dict(stub.tar_gets) == {12: 1}


def test_a_second_call_and_a_later_process_reuse_what_was_downloaded(stub, tmp_path):
    with _resume(stub) as run:
        first = run.resume_checkpoint()
        assert run.resume_checkpoint() is first
    with _resume(stub) as again:
        assert again.resume_checkpoint().path == first.path
    assert dict(stub.tar_gets) == {12: 1}
    assert stub.list_gets == 2  # one list per start, none per call


@pytest.mark.parametrize("damage", ["rewritten", "half-extracted", "file-added"])
def test_a_changed_or_half_made_cache_entry_is_replaced_never_trusted(stub, tmp_path, caplog, damage):
    with _resume(stub) as run:
        cached = run.resume_checkpoint().path / "nested" / "model.bin"
    entry = cached.parents[2]
    if damage == "rewritten":  # same size, mtime put back: only the ctime tells
        before = cached.stat()
        cached.chmod(0o644)
        cached.write_bytes(b"X" * before.st_size)
        os.utime(cached, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif damage == "half-extracted":
        entry.chmod(0o755)
        (entry / checkpoint_cache.RECORD_FILE).unlink()
    else:
        (cached.parent).chmod(0o755)
        (cached.parent / "extra.bin").write_bytes(b"!")
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), _resume(stub) as run:
        checkpoint = run.resume_checkpoint()
    assert (checkpoint.path / "nested" / "model.bin").read_bytes() == b"weights at step 20" * 100
    assert not (checkpoint.path / "nested" / "extra.bin").exists()
    assert f"the cached copy of checkpoint 12 in {entry}" in caplog.text and "replacing it" in caplog.text
    assert dict(stub.tar_gets) == {12: 2}
    assert sorted(p.name for p in entry.parent.iterdir()) == [".12.lock", "12"]  # nothing half-made left


def test_a_tampered_stored_checkpoint_is_refused_and_nothing_is_cached(stub, tmp_path):
    stub.tamper(12)
    with _resume(stub) as run, pytest.raises(CheckpointError, match=r"^Checkpoint 12 \w+ mismatch"):
        run.resume_checkpoint()
    assert not _entry(tmp_path, stub, 12).exists()
    assert [p.name for p in _entry(tmp_path, stub, 12).parent.iterdir()] == [".12.lock"]


def test_mmt_resume_checkpoint_id_may_name_the_latest_checkpoint_but_a_run_cannot_go_back(stub, monkeypatch):
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_ID", "12")
    with _resume(stub) as run:
        assert (run.resume_checkpoint().step, run.resume_checkpoint().id) == (20, 12)
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_ID", "11")
    with _resume(stub) as run, pytest.raises(ResumeError) as caught:
        run.resume_checkpoint()
    assert str(caught.value) == (
        "MMT_RESUME_CHECKPOINT_ID=11 is checkpoint at step 10, but run exp-1 already recorded steps up to 26 (its "
        "latest checkpoint is at step 20): a run cannot go back; to branch from an older checkpoint start a new Run "
        "from it (mado job resume JOB --checkpoint 11, or start_run with a new id and load that checkpoint)"
    )
    assert dict(stub.tar_gets) == {12: 1}  # nothing of the older one was downloaded


def test_an_older_checkpoint_is_the_latest_once_the_newer_ones_are_not_complete(stub, monkeypatch):
    stub.checkpoints[12]["state"] = "deleted"
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_ID", "11")
    with _resume(stub) as run:
        assert run.resume_checkpoint().step == 10
    assert dict(stub.tar_gets) == {11: 1}


@pytest.mark.parametrize("value", ["eleven", "0", "-3", "１２"])
def test_a_bad_mmt_resume_checkpoint_id_is_refused_by_start_run_before_any_request(stub, monkeypatch, value):
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_ID", value)
    with pytest.raises(ValueError, match=f"MMT_RESUME_CHECKPOINT_ID must be a checkpoint id .*got '{value}'"):
        _resume(stub)
    assert stub.runs == [] and stub.list_gets == 0


def test_an_unknown_mmt_resume_checkpoint_id_is_named(stub, monkeypatch):
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_ID", "99999")
    with _resume(stub) as run, pytest.raises(mado_tracking.ApiError) as caught:
        run.resume_checkpoint()
    assert str(caught.value) == "MMT_RESUME_CHECKPOINT_ID=99999: checkpoint 99999 not found"
    assert caught.value.status == 404


def test_a_checkpoint_of_another_run_or_a_pending_one_is_refused(stub, monkeypatch):
    stub.add_checkpoint(14, 40)
    stub.checkpoints[14]["run_id"] = 2
    stub.add_checkpoint(15, 50, state="pending")
    for chosen, error, message in (
        ("14", ResumeError, "belongs to another run"),
        ("15", CheckpointError, "MMT_RESUME_CHECKPOINT_ID=15: checkpoint 15 is pending"),
    ):
        monkeypatch.setenv("MMT_RESUME_CHECKPOINT_ID", chosen)
        with _resume(stub) as run, pytest.raises(error, match=message):
            run.resume_checkpoint()
    assert not stub.tar_gets


def test_a_jobs_mmt_resume_variables_still_win(stub, monkeypatch, tmp_path):
    directory = tmp_path / "job-checkpoint"
    directory.mkdir()
    (tmp_path / "resume.json").write_text(json.dumps({"checkpointId": 7, "sourceRunId": 3, "step": 5}))
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_DIR", str(directory))
    monkeypatch.setenv("MMT_RESUME_STEP", "5")
    monkeypatch.setenv("MMT_RESUME_CHECKPOINT_FILE", str(tmp_path / "resume.json"))
    with _resume(stub) as run:
        assert (run.resume_checkpoint().path, run.resume_checkpoint().id) == (directory, 7)
    assert not stub.tar_gets


def test_a_new_run_fetches_nothing():
    with ResumeStubApi(resumed=False) as stub:
        stub.add_checkpoint(12, 20)
        with _resume(stub) as run:
            assert run.resume_checkpoint() is None
        assert not stub.tar_gets and stub.list_gets == 0


def test_starting_below_the_checkpoint_without_resume_checkpoint_is_told_once_at_the_first_call(stub, caplog):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), _resume(stub) as run:
        assert run.step == 27
        for step in range(5):
            run.log_metrics({"loss": 1.0}, step=step)
    told = [r.getMessage() for r in caplog.records if "without having called run.resume_checkpoint()" in r.getMessage()]
    assert len(told) == 1
    assert told[0].startswith(
        "mado: run exp-1 was resumed and has a checkpoint at step 20, but this process calls log_metrics at step 0"
    )
    assert "Its points below step 27 are compared with the first ones" in told[0]


def test_a_process_that_resumes_from_the_checkpoint_is_not_warned(stub, caplog, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_bytes(b"w")
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), _resume(stub) as run:
        start = run.resume_checkpoint().step
        for step in range(start, start + 3):
            run.log_metrics({"loss": 1.0}, step=step)
    assert "without having called run.resume_checkpoint()" not in caplog.text


def test_steps_logged_before_the_stop_are_sent_again_for_the_server_to_compare(stub, caplog):
    with caplog.at_level(logging.INFO, logger="mado_tracking"), _resume(stub) as run:
        start = run.resume_checkpoint().step
        for step in range(start, 30):
            run.log_metrics({"loss": 1.0}, step=step)
        assert run.step == 30
    assert [step for key, step in points_of(stub)] == list(range(20, 30))  # 20-26 compared by the server
    assert "steps 20 to 26 were logged before it stopped; the points this process logs for them are compared" in (
        caplog.text
    )


def test_log_checkpoint_below_the_checkpoint_is_told_before_the_upload(stub, caplog, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_bytes(b"w")
    run = _resume(stub)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), pytest.raises(mado_tracking.ApiError):
        run.log_checkpoint(tmp_path / "ckpt", step=10)  # the stub takes no checkpoint upload
    run.finish()
    assert "calls log_checkpoint at step 10 without having called run.resume_checkpoint()" in caplog.text


@pytest.mark.parametrize("locks", [True, False])
def test_two_fetches_of_one_checkpoint_at_once_both_get_a_whole_copy(stub, monkeypatch, locks):
    if not locks:  # a file system without flock: both download, the second rename loses and uses the first's
        monkeypatch.setattr(checkpoint_cache, "_locked", _no_lock)
    found, errors = [], []

    def fetch():
        client = ApiClient(Config(api_url=stub.url, api_token="stub-token"))
        try:
            found.append(checkpoint_cache.fetch(client, 12))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(found) == 2 and found[0].path == found[1].path
    assert (found[0].path / "nested" / "model.bin").read_bytes() == b"weights at step 20" * 100
    if locks:  # the second waited for the first and found its copy
        assert stub.tar_gets[12] == 1
    assert [p.name for p in found[0].path.parents[1].iterdir() if p.name.endswith((".partial", ".stale"))] == []


class _no_lock:
    def __init__(self, path):
        pass

    def __enter__(self):
        return False

    def __exit__(self, *exc):
        return False
