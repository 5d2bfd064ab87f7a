"""The lost-work ledger counts real time: a training process SIGKILLed a known time after a known checkpoint
(docs/design/alerts.md#reliability).

A real Python process trains through ``mado_tracking`` against the live test server, beating every
``HEARTBEAT_S`` with a server crash timeout of ``CRASH_TIMEOUT_S``. Once it saved a checkpoint the test kills its
process group ``KILL_AFTER_S`` after the checkpoint's creation, then calls the reaper once the timeout has passed.
The Reliability API must count the lost work as kill time − checkpoint time, within one heartbeat interval (the
last beat before the kill is the last sign of life), and hours run to the last beat, never to the reaper's pass
``CRASH_TIMEOUT_S`` later. The same run is then resumed by id, killed again and reaped: the ledger holds both
failures (the first linked to the resume, the second on the resumed segment) and the failure count and MTBF
count both.
"""

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from alerts.reliability import project_reliability
from checkpoints.models import Checkpoint
from runs.liveness import runs_reap_crashed
from runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

HEARTBEAT_S = 0.5  # MMT_HEARTBEAT_INTERVAL of the training process
CRASH_TIMEOUT_S = 2  # the server's MMT_CRASH_TIMEOUT
KILL_AFTER_S = 1.5  # the kill comes this long after the checkpoint's creation
IN_FLIGHT_S = 0.25  # a beat's request on the wire at the kill, or late by as much on a loaded parallel suite
DEADLINE_S = 20.0
RUN_ID = "ledger-kill"

TRAINING = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import mado_tracking

    run = mado_tracking.start_run(id=sys.argv[1], resume="allow")
    first = run.step
    for step in range(first, first + 5):
        run.log_metrics({"train.loss": 1.0 / (step + 1)}, step=step)
    ckpt = Path(f"ckpt-{first}")
    ckpt.mkdir()
    (ckpt / "weights.bin").write_bytes(b"w" * 4096)
    before = time.time()
    saved = run.log_checkpoint(ckpt, step=first + 5)
    print("saved", saved.id, before, time.time(), flush=True)
    step = first + 5
    while True:  # training goes on past the checkpoint until the test kills the process
        step += 1
        run.log_metrics({"train.loss": 1.0 / (step + 1)}, step=step)
        time.sleep(0.05)
""")


@dataclass
class Crash:
    """One segment of the run: when the server started it, its checkpoint, when the test killed it, the reaper."""

    started_at: datetime
    checkpoint_at: datetime
    killed_at: datetime
    ended_at: datetime


def _wait_for(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not (found := condition()):
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.02)
    return found


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)


def _train_until_killed(mmt_env, tmp_path, segment: int) -> Crash:
    """Run the training program, kill its process group ``KILL_AFTER_S`` after its checkpoint, reap the run."""
    log = tmp_path / f"training-{segment}.log"
    with log.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", TRAINING, RUN_ID],
            cwd=tmp_path,
            env={**os.environ, **mmt_env, "MMT_HEARTBEAT_INTERVAL": str(HEARTBEAT_S)},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own process group: the kill takes every thread and child of it
        )
    said = queue.Queue()
    threading.Thread(target=_lines, args=(child.stdout, said), daemon=True).start()
    try:
        try:
            words = said.get(timeout=DEADLINE_S).split()
        except queue.Empty:
            pytest.fail(f"no checkpoint saved in {DEADLINE_S} s: {log.read_text()}")
        assert words[0] == "saved", log.read_text()
        checkpoint = Checkpoint.objects.get(pk=int(words[1]))
        assert float(words[2]) <= checkpoint.created_at.timestamp() <= float(words[3])
        run = Run.objects.get(external_id=RUN_ID)
        assert run.resume_count == segment and run.status == RunStatus.RUNNING
        started_at = run.writer_since if segment else run.started_at
        kill_at = checkpoint.created_at + timedelta(seconds=KILL_AFTER_S)
        _wait_for(lambda: timezone.now() >= kill_at or child.poll() is not None, "the kill time")
        assert child.poll() is None, log.read_text()
        killed_at = timezone.now()
        os.killpg(child.pid, signal.SIGKILL)
        assert child.wait(DEADLINE_S) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(DEADLINE_S)
        child.stdout.close()
    _wait_for(lambda: runs_reap_crashed() == 1, "the reaper ended the silent run")
    run.refresh_from_db()
    assert run.status == RunStatus.CRASHED and run.resume_count == segment
    return Crash(started_at, checkpoint.created_at, killed_at, run.ended_at)


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def _assert_counted_to_the_kill(row: dict, crash: Crash) -> None:
    """The ledger row ends at the last beat before the kill: lost work = kill − checkpoint within a beat."""
    expected = _seconds(crash.killed_at, crash.checkpoint_at)
    assert row["status"] == "crashed"
    assert datetime.fromisoformat(row["last_checkpoint_at"]) == crash.checkpoint_at
    assert expected - HEARTBEAT_S - IN_FLIGHT_S <= row["lost_work_s"] <= expected + IN_FLIGHT_S, (row, expected)
    alive = datetime.fromisoformat(row["last_alive_at"])
    assert _seconds(crash.ended_at, alive) >= CRASH_TIMEOUT_S  # the reaper's pass came a timeout later
    assert row["lost_work_s"] <= _seconds(crash.ended_at, crash.checkpoint_at) - CRASH_TIMEOUT_S


def _assert_hours_run_to_the_kills(crashes: list[Crash], hours_run: float) -> None:
    """Hours run = Σ (kill − segment start) within a beat per segment; the reaper's passes add nothing."""
    expected = sum(_seconds(c.killed_at, c.started_at) for c in crashes)
    ran = hours_run * 3600
    slack = len(crashes) * (HEARTBEAT_S + IN_FLIGHT_S)
    assert expected - slack <= ran <= expected + len(crashes) * IN_FLIGHT_S, (ran, expected)
    assert ran <= sum(_seconds(c.ended_at, c.started_at) for c in crashes) - len(crashes) * CRASH_TIMEOUT_S


def test_a_killed_run_loses_the_work_since_its_checkpoint_and_a_resumed_crash_counts_again(
    mmt_env, settings, api, project, viewer, tmp_path
):
    settings.MMT_CRASH_TIMEOUT = CRASH_TIMEOUT_S
    reliability = f"/api/v1/projects/{project.slug}/reliability/"

    first = _train_until_killed(mmt_env, tmp_path, segment=0)

    body = api(viewer).get(reliability).json()
    assert body["failures"] == 1 and body["advice"] == "not enough failures yet"
    [row] = body["ledger"]
    assert row["segment"] == 0 and row["resumed_at"] is None and row["restart_s"] == 0
    _assert_counted_to_the_kill(row, first)
    _assert_hours_run_to_the_kills([first], project_reliability(project=project).hours_run)

    second = _train_until_killed(mmt_env, tmp_path, segment=1)  # the same run, resumed by id

    body = api(viewer).get(reliability).json()
    run = Run.objects.get(external_id=RUN_ID)
    assert body["failures"] == 2 and body["advice"] is None
    rows = sorted(body["ledger"], key=lambda r: r["segment"])
    assert [(r["run_id"], r["segment"], r["resumed_by"]) for r in rows] == [(run.pk, 0, None), (run.pk, 1, None)]
    resumed, crashed_again = rows
    assert datetime.fromisoformat(resumed["resumed_at"]) == second.started_at  # linked to the resumed segment
    assert resumed["restart_s"] == pytest.approx(
        _seconds(second.started_at, datetime.fromisoformat(resumed["last_alive_at"])), abs=1e-3
    )
    assert crashed_again["resumed_at"] is None and crashed_again["restart_s"] == 0
    _assert_counted_to_the_kill(resumed, first)
    _assert_counted_to_the_kill(crashed_again, second)
    rel = project_reliability(project=project)
    _assert_hours_run_to_the_kills([first, second], rel.hours_run)
    assert rel.mtbf_h == pytest.approx(rel.hours_run / 2)
    assert body["mtbf_hours"] == pytest.approx(rel.hours_run / 2, abs=1e-3)
    assert [q["failures"] for q in body["queues"]] == [2]
