"""Heartbeats, the single-writer lease and losing a Run, from the SDK against the real API
(docs/design/runs.md#one-writer-process, #states)."""

import logging
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

import mado_tracking
from mado_tracking import ApiError, MadoError, heartbeat
from mado_tracking.client import jittered
from runs.liveness import runs_reap_crashed
from runs.models import MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_for(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _make_stale(run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))


def _wait_for_next_beat(run_id: int) -> None:
    beat = Run.objects.get(pk=run_id).heartbeat_at
    _wait_for(lambda: Run.objects.get(pk=run_id).heartbeat_at > beat)


def _errors(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and text in r.getMessage()]


def test_the_sender_thread_heartbeats_every_interval(mmt_env, monkeypatch):
    monkeypatch.setenv("MMT_HEARTBEAT_INTERVAL", "0.2")
    with mado_tracking.start_run() as run:
        started = Run.objects.get(pk=run.id).heartbeat_at
        _wait_for(lambda: Run.objects.get(pk=run.id).heartbeat_at > started)
        beat = Run.objects.get(pk=run.id).heartbeat_at
        _wait_for(lambda: Run.objects.get(pk=run.id).heartbeat_at > beat)
    assert not run.lost


def test_a_jittered_wait_is_80_to_100_percent_of_the_interval_and_varies():
    waits = [jittered(30.0) for _ in range(1000)]
    assert min(waits) >= 24.0 and max(waits) <= 30.0
    assert max(waits) - min(waits) > 4.0  # twenty processes started together drift apart


def test_each_beat_waits_a_jittered_part_of_the_interval(mmt_env, monkeypatch):
    asked, waited = [], []

    def spy(seconds):
        asked.append(seconds)
        waited.append(jittered(seconds))
        return waited[-1]

    monkeypatch.setattr(heartbeat, "jittered", spy)
    monkeypatch.setenv("MMT_HEARTBEAT_INTERVAL", "0.2")
    with mado_tracking.start_run() as run:
        for _ in range(3):
            _wait_for_next_beat(run.id)
    assert len(asked) >= 3 and set(asked) == {0.2}
    assert all(0.16 <= wait <= 0.2 for wait in waited)


@pytest.mark.parametrize(("interval", "warned"), [("300", True), ("299", False)])
def test_an_interval_outside_the_crash_timeout_is_warned_about(
    mmt_env, monkeypatch, settings, caplog, interval, warned
):
    settings.MMT_CRASH_TIMEOUT = 300
    monkeypatch.setenv("MMT_HEARTBEAT_INTERVAL", interval)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"), mado_tracking.start_run(id="slow-beats") as run:
        pass
    said = [r.getMessage() for r in caplog.records if "crash timeout" in r.getMessage()]
    assert said == (
        [
            f"mado: heartbeats every {interval} s (MMT_HEARTBEAT_INTERVAL) are not within the server's "
            "crash timeout of 300 s: run slow-beats will be marked crashed between them"
        ]
        if warned
        else []
    )
    assert run.status == "finished"


def test_a_process_taken_over_loses_its_writes_and_says_so_once(mmt_env, monkeypatch, tmp_path):
    script = (
        "import sys, mado_tracking\n"
        "run = mado_tracking.start_run(id='exp-f')\n"
        "run.log_metrics({'loss': 1.0})\n"
        "run._sender.flush(10)\n"
        "print('started', flush=True)\n"
        "sys.stdin.readline()\n"  # meanwhile another process resumes the run
        "run.log_metrics({'loss': 2.0})\n"
        "run._sender.flush(10)\n"
        "run.log_metrics({'loss': 3.0})\n"
        "run.log_metrics({'loss': 4.0})\n"
        "print('lost' if run.lost else 'not lost', flush=True)\n"
    )
    env = {**os.environ, **mmt_env, "MMT_HEARTBEAT_INTERVAL": "60"}
    a = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert a.stdout.readline().strip() == "started"
        stored = Run.objects.get(external_id="exp-f")
        _make_stale(stored.pk)  # as if A had hung for an hour
        b = mado_tracking.start_run(id="exp-f", resume="allow")
        assert (b.id, b.resumed, b.step, b.fencing_token) == (stored.pk, True, 1, stored.lease_token + 1)
        out, err = a.communicate("go\n", timeout=60)
    finally:
        a.kill()
    b.log_metrics({"loss": 20.0})
    b.finish()
    assert out.strip().splitlines()[-1] == "lost", err
    assert err.count("was taken over by another process") == 1, err
    assert err.count("log_metrics values are dropped") == 1, err
    steps = list(MetricPoint.objects.filter(run_id=stored.pk).order_by("step").values_list("step", "value"))
    assert steps == [(0, 1.0), (1, 20.0)]  # nothing of A after the takeover
    assert Run.objects.get(pk=stored.pk).status == RunStatus.FINISHED  # A's exit did not end B's run


def test_a_taken_over_checkpoint_save_raises_and_later_metrics_are_dropped(mmt_env, tmp_path, caplog):
    a = mado_tracking.start_run(id="ckpt-f")
    _make_stale(a.id)
    b = mado_tracking.start_run(id="ckpt-f", resume="must")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "weights.bin").write_bytes(b"w" * 10)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        with pytest.raises(ApiError) as caught:
            a.log_checkpoint(tmp_path / "ckpt", step=1)
        assert caught.value.code == "lease_lost" and a.lost
        with pytest.raises(MadoError, match="no longer written by this process"):
            a.log_training_data_stage(0, [1])
        a.log_metrics({"loss": 1.0})  # dropped, not raised
        a.finish()
    assert len(_errors(caplog, "run ckpt-f was taken over by another process")) == 1
    b.finish()
    assert Run.objects.get(pk=b.id).status == RunStatus.FINISHED
    assert not MetricPoint.objects.filter(run_id=b.id).exists()


def test_a_run_reaped_as_crashed_is_lost_at_its_next_heartbeat(mmt_env, monkeypatch, caplog):
    monkeypatch.setenv("MMT_HEARTBEAT_INTERVAL", "0.2")
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        run = mado_tracking.start_run(id="silent")
        assert runs_reap_crashed(now=timezone.now() + timedelta(days=1)) == 1
        _wait_for(lambda: run.lost)
        run.log_metrics({"loss": 1.0})
        run.finish()
    assert len(_errors(caplog, "run silent ended as crashed on the server")) == 1
    assert Run.objects.get(pk=run.id).status == RunStatus.CRASHED  # only a resume restarts it
    with mado_tracking.start_run(id="silent", resume="must") as again:
        assert again.resumed
    assert Run.objects.get(pk=run.id).status == RunStatus.FINISHED
