"""``run.log_checkpoint(..., wait=False)`` against the real API on a live server
(docs/design/checkpoints.md#a-checkpoint, #save-and-restore).

The save returns once the files are snapshotted, uploads on a background
thread, ``finish()`` waits; refusals stay synchronous; a full queue blocks
and says so; a failed upload is logged and raised by ``finish()``; a process
SIGKILLed mid-upload leaves the checkpoint ``pending`` and the next start of
the same run completes it from the staging directory; so does a process that
exits with uploads still queued or running, saying so.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.utils import timezone

import mado_tracking
from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking import CheckpointError, saving
from runs.models import Run
from tests.sdk.test_log_checkpoint import _empty_subdirectory, _fast_backoff, _link, _manifest, ckpt  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def _stored_manifest(checkpoint_id: int) -> list[dict]:
    return list(Checkpoint.objects.get(pk=checkpoint_id).manifest.order_by("path").values("path", "size", "sha256"))


def _staged_steps(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / ".mado" / "cache").rglob("step-*"))


def _wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_a_background_save_returns_a_future_and_the_checkpoint_completes_by_finish(mmt_env, ckpt, tmp_path):
    expected = _manifest(ckpt)
    run = mado_tracking.start_run()
    future = run.log_checkpoint(ckpt, step=10, includes_optimizer=True, framework="torch", wait=False)
    assert isinstance(future, Future)
    (ckpt / "model.pt").write_bytes(b"the next step's weights")  # the caller may change it at once
    run.finish()
    saved = future.result(timeout=0)
    stored = Checkpoint.objects.get(pk=saved.id)
    assert (stored.step, stored.state, stored.framework, stored.includes_optimizer) == (
        10,
        CheckpointState.COMPLETE,
        "torch",
        True,
    )
    assert _stored_manifest(saved.id) == expected
    assert _staged_steps(tmp_path) == []  # the snapshot is gone once complete


def _missing(root):
    for path in sorted(root.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    root.rmdir()
    return "ckpt: is not a directory"


@pytest.mark.parametrize("spoil", [_link, _empty_subdirectory, _missing])
def test_a_bad_directory_is_refused_at_the_call_with_nothing_staged(mmt_env, ckpt, tmp_path, spoil):
    reason = spoil(ckpt)
    with mado_tracking.start_run() as run:
        with pytest.raises(CheckpointError, match=reason):
            run.log_checkpoint(ckpt, step=1, wait=False)
    assert not Checkpoint.objects.exists() and _staged_steps(tmp_path) == []


@pytest.mark.parametrize("step", [-1, 1.5, True])
def test_a_bad_step_or_a_step_saved_twice_is_refused_at_the_call(mmt_env, ckpt, step):
    with mado_tracking.start_run() as run:
        with pytest.raises(CheckpointError, match="step must be"):
            run.log_checkpoint(ckpt, step=step, wait=False)
        run.log_checkpoint(ckpt, step=3, wait=False)
        with pytest.raises(CheckpointError, match="step 3 is already saved in run"):
            run.log_checkpoint(ckpt, step=3, wait=False)
        with pytest.raises(CheckpointError, match="step 3 is already saved in run"):
            run.log_checkpoint(ckpt, step=3)
    assert list(Checkpoint.objects.values_list("step", "state")) == [(3, CheckpointState.COMPLETE)]


def test_a_bad_queue_size_is_refused_naming_the_variable(mmt_env, ckpt, monkeypatch):
    monkeypatch.setenv("MMT_CHECKPOINT_QUEUE", "0")
    with mado_tracking.start_run() as run:
        with pytest.raises(ValueError, match="MMT_CHECKPOINT_QUEUE must be a whole number >= 1"):
            run.log_checkpoint(ckpt, step=1, wait=False)


def _register_as_another_process(mmt_env, run_id: int, *, step: int) -> None:
    answer = requests.post(
        f"{mmt_env['MMT_API_URL']}/api/v1/runs/{run_id}/checkpoints/",
        json={"step": step},
        headers={"Authorization": f"Bearer {mmt_env['MMT_API_TOKEN']}"},
        timeout=30,
    )
    assert answer.status_code == 201


def test_a_refused_background_upload_is_logged_then_raised_by_finish(mmt_env, ckpt, tmp_path, caplog):
    run = mado_tracking.start_run()
    _register_as_another_process(mmt_env, run.id, step=7)
    future = run.log_checkpoint(ckpt, step=7, wait=False)
    assert isinstance(future.exception(timeout=30), CheckpointError)
    assert "checkpoint of run" in caplog.text and "step 7 is already saved in this run" in caplog.text
    with pytest.raises(CheckpointError, match="1 checkpoint upload.* failed: step 7: .*already saved") as caught:
        run.finish()
    assert str(caught.value).endswith(
        "They are uploaded when this run starts again (its id with resume='allow'), except those the server "
        "refused (above)"
    )
    assert Run.objects.get(pk=run.id).status == "finished"  # the status is set before the error is raised
    assert _staged_steps(tmp_path) == []  # refused: sending it again would be refused again


def test_leaving_a_with_block_cleanly_raises_a_failed_background_upload(mmt_env, ckpt):
    with pytest.raises(CheckpointError, match="step 7: .*already saved"):
        with mado_tracking.start_run() as run:
            _register_as_another_process(mmt_env, run.id, step=7)
            run.log_checkpoint(ckpt, step=7, wait=False)
    assert Run.objects.get(pk=run.id).status == "finished"


class HeldUploads:
    """Holds every background upload until ``release()``; counts those that started."""

    def __init__(self, monkeypatch):
        self.gate = threading.Event()
        self.started = 0
        real = saving.upload_checkpoint

        def held(*args, **kwargs):
            self.started += 1
            assert self.gate.wait(30), "the test never released the upload"
            return real(*args, **kwargs)

        monkeypatch.setattr(saving, "upload_checkpoint", held)

    def release(self):
        self.gate.set()


def test_a_full_queue_blocks_the_next_save_and_says_so_and_finish_waits(mmt_env, ckpt, monkeypatch, caplog):
    monkeypatch.setenv("MMT_CHECKPOINT_QUEUE", "1")
    held = HeldUploads(monkeypatch)
    run = mado_tracking.start_run()
    first = run.log_checkpoint(ckpt, step=1, wait=False)
    _wait_for(lambda: held.started == 1, "the first upload to start")
    second: list = []
    saver = threading.Thread(target=lambda: second.append(run.log_checkpoint(ckpt, step=2, wait=False)))
    saver.start()
    _wait_for(lambda: "checkpoint uploads of run" in caplog.text, "the queue-full log line")
    assert "(at most 1, MMT_CHECKPOINT_QUEUE); saving step 2 waits" in caplog.text
    assert saver.is_alive() and not second and not first.done()
    finisher = threading.Thread(target=run.finish)
    held.release()
    saver.join(30)
    finisher.start()
    finisher.join(60)
    assert not finisher.is_alive()
    assert first.result(timeout=0).step == 1 and second[0].result(timeout=0).step == 2
    assert set(Checkpoint.objects.values_list("step", "state")) == {
        (1, CheckpointState.COMPLETE),
        (2, CheckpointState.COMPLETE),
    }
    assert Run.objects.get(pk=run.id).status == "finished"


CHILD = textwrap.dedent("""
    import sys, time
    import mado_tracking
    from mado_tracking import tarstream

    whole = tarstream.CheckpointTar.__iter__

    def first_chunk_then_hang(self):  # the PUT is on the wire, half sent, when the parent kills us
        for chunk in whole(self):
            yield chunk
            print("sending", flush=True)
            time.sleep(3600)

    tarstream.CheckpointTar.__iter__ = first_chunk_then_hang
    run = mado_tracking.start_run(id="killed-mid-upload")
    run.log_checkpoint(sys.argv[1], step=20, framework="torch", wait=False)
    print("returned", flush=True)
    time.sleep(3600)
""")


def test_a_process_killed_mid_upload_leaves_pending_and_the_same_run_resumed_completes_it(mmt_env, ckpt, tmp_path):
    expected = _manifest(ckpt)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ckpt)],
        cwd=tmp_path,
        env={**os.environ, **mmt_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [child.stdout.readline().strip() for _ in range(2)]
        assert sorted(lines) == ["returned", "sending"], child.stderr.read() if child.poll() is not None else lines
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        child.kill()
    stored = Checkpoint.objects.get(step=20)
    assert stored.state == CheckpointState.PENDING
    assert _staged_steps(tmp_path) == ["step-20"]
    for path in ckpt.rglob("*"):  # the snapshot, not the training directory, is what gets uploaded
        if path.is_file():
            path.write_bytes(b"changed after the save")
    Run.objects.filter(pk=stored.run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    with mado_tracking.start_run(id="killed-mid-upload", resume="must") as run:
        assert run.id == stored.run_id
    stored.refresh_from_db()
    assert stored.state == CheckpointState.COMPLETE and stored.framework == "torch"
    assert _stored_manifest(stored.id) == expected
    assert _staged_steps(tmp_path) == []


EXITING_CHILD = textwrap.dedent("""
    import concurrent.futures.thread, os, sys, threading, time
    import mado_tracking
    from mado_tracking import saving

    real = saving.upload_checkpoint
    started = threading.Event()

    def once_the_interpreter_exits(*args, **kwargs):  # the first upload runs on as the program ends
        started.set()
        os.write(1, b"uploading\\n")  # one write: the main thread prints beside it
        while not concurrent.futures.thread._shutdown:  # Python's flag: no new thread pool work from now on
            time.sleep(0.01)
        return real(*args, **kwargs)

    saving.upload_checkpoint = once_the_interpreter_exits
    run = mado_tracking.start_run(id="exiting")
    run.log_checkpoint(sys.argv[1], step=10, framework="torch", wait=False)
    started.wait(60)  # the first upload is under way (on a loaded machine its thread may start late)
    run.log_checkpoint(sys.argv[1], step=20, framework="torch", wait=False)  # queued behind it
    os.write(1, b"returned\\n")
""")  # the program ends here, its Run open: the SDK finishes it at exit


def test_a_process_exiting_with_uploads_queued_says_so_and_the_next_start_uploads_them(mmt_env, ckpt, tmp_path):
    expected = _manifest(ckpt)
    child = subprocess.run(
        [sys.executable, "-c", EXITING_CHILD, str(ckpt)],
        cwd=tmp_path,
        env={**os.environ, **mmt_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sorted(child.stdout.split()) == ["returned", "uploading"], child.stderr
    message = "the process is exiting: the checkpoint is left pending and the next start of the Run uploads it"
    said = [line for line in child.stderr.splitlines() if "checkpoint at step" in line]
    assert [line.split(" (snapshot")[0] for line in said] == [
        "mado: run exiting, checkpoint at step 10",
        "mado: run exiting, checkpoint at step 20",
    ], child.stderr
    assert all(line.endswith(f"): {message}") for line in said), child.stderr
    assert "cannot schedule new futures" not in child.stderr
    assert _staged_steps(tmp_path) == ["step-10", "step-20"]
    assert not Checkpoint.objects.filter(state=CheckpointState.COMPLETE).exists()
    with mado_tracking.start_run(id="exiting", resume="allow") as run:  # the next start of the same Run
        assert run.id == Run.objects.get(external_id="exiting").pk
    stored = Checkpoint.objects.filter(run_id=run.id).order_by("step")
    assert [(c.step, c.state) for c in stored] == [(10, CheckpointState.COMPLETE), (20, CheckpointState.COMPLETE)]
    assert all(_stored_manifest(c.id) == expected for c in stored)
    assert _staged_steps(tmp_path) == []


def test_offline_a_background_save_is_the_local_copy(tmp_path, ckpt):
    run = mado_tracking.start_run(offline=True, output=tmp_path / "offline")
    future = run.log_checkpoint(ckpt, step=4, wait=False)
    run.finish()
    saved = future.result(timeout=0)
    assert saved.id is None and _manifest(Path(saved.location)) == _manifest(ckpt)
