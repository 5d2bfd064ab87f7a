"""``mado_tracking.preemption``: a stop signal becomes a flag, a checkpoint that records the signal, and an exit
the Run ends ``preempted`` by (docs/design/runs.md#preemption; docs/design/checkpoints.md#metadata)."""

import os
import signal
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from checkpoints.models import Checkpoint
from mado_tracking import preemption
from mado_tracking.cli import main
from runs.models import Run, RunStatus
from tests.sdk.programs import signal_once_ready

pytestmark = pytest.mark.django_db(transaction=True)

LOOP = """
import os, pathlib, sys, time, mado_tracking
from mado_tracking import preemption
from mado_tracking.cli import main
run = mado_tracking.start_run(id="sig-1")
stop = preemption.install(run)
print("ready", flush=True)
step = 0
while True:
    run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    step += 1
    if stop.requested:
        ckpt = pathlib.Path("ckpt"); ckpt.mkdir(exist_ok=True); (ckpt / "model.pt").write_bytes(b"w" * 1000)
        run.log_checkpoint(ckpt, step=step, metadata={**stop.metadata(), "note": "on signal"})
        print("saved", step, flush=True)
        stop.exit()
    time.sleep(0.02)
"""


def test_sigterm_mid_loop_saves_a_complete_checkpoint_that_records_the_signal_and_ends_preempted(mmt_env, tmp_path):
    child = signal_once_ready([sys.executable, "-c", LOOP], env=mmt_env, cwd=tmp_path, ready="ready", timeout=60)
    out, err = child.stdout, child.stderr
    assert child.returncode == 128 + signal.SIGTERM, err
    assert out.startswith("saved "), err
    run = Run.objects.get(external_id="sig-1")
    assert run.status == RunStatus.PREEMPTED
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.state == "complete" and checkpoint.step == int(out.split()[1])
    assert checkpoint.metadata["preemption"]["signal"] == "SIGTERM" and checkpoint.metadata["note"] == "on signal"
    assert 0 <= checkpoint.signal_to_complete_s < 30
    shown = CliRunner().invoke(main, ["checkpoint", "show", str(checkpoint.pk)], env=mmt_env, catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert f"at step {checkpoint.step}: complete" in shown.output
    assert "saved on signal: SIGTERM, complete " in shown.output and " s after the signal" in shown.output
    assert "holds: unknown" in shown.output and 'metadata: {"note": "on signal"}' in shown.output


def test_the_flag_records_the_first_signal_and_calls_the_handler_that_was_there_before():
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        stop = preemption.install(signals=(signal.SIGUSR1,))
        assert not stop.requested and stop.metadata() == {}
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.signal_name == "SIGUSR1" and seen == [signal.SIGUSR1]
        first = stop.metadata()["preemption"]["signal_at"]
        assert stop.metadata() == {"preemption": {"signal": "SIGUSR1", "signal_at": first}}
        stop.uninstall()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1] * 2  # the earlier handler is back
    finally:
        signal.signal(signal.SIGUSR1, previous)


STUCK = """
import signal, threading
from mado_tracking import preemption
stop = preemption.install()
stop._record(signal.SIGTERM)  # what agreed() records when only another rank was told
print("ready", flush=True)
threading.Event().wait()  # blocked where the flag is never read, as in a collective whose peers are gone
"""


def test_a_second_signal_ends_a_process_that_is_blocked_and_never_reads_the_flag(tmp_path):
    def twice(child):
        for _ in range(2):
            child.send_signal(signal.SIGTERM)
            time.sleep(0.5)

    child = signal_once_ready(
        [sys.executable, "-c", STUCK], env={}, cwd=tmp_path, ready="ready", timeout=30, send=twice
    )
    assert child.returncode == -signal.SIGTERM, child.stderr
    assert "second SIGTERM before the checkpoint was saved: exiting now" in child.stderr


def test_exit_leaves_with_128_plus_the_signal_and_refuses_without_one():
    stop = preemption.Preemption()
    with pytest.raises(RuntimeError, match="no stop signal"):
        stop.exit()
    stop._record(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        stop.exit()
    assert exited.value.code == 143


def test_install_outside_the_main_thread_is_refused():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_install_error()))
    thread.start()
    thread.join()
    assert "main thread" in errors[0]


def _install_error() -> str:
    try:
        preemption.install()
    except ValueError as error:
        return str(error)
    return ""


@pytest.mark.parametrize("metadata", [["not", "a", "dict"], {"when": object()}, {"loss": float("nan")}])
def test_log_checkpoint_refuses_metadata_that_is_not_a_json_object_at_the_call(tmp_path, metadata):
    import mado_tracking
    from mado_tracking.errors import CheckpointError

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"w")
    with mado_tracking.start_run(offline=True, output=tmp_path / "off") as run:
        with pytest.raises(CheckpointError, match="metadata") as refused:
            run.log_checkpoint(tmp_path / "ckpt", step=1, metadata=metadata)
        assert refused.value.field == "metadata"
        run.log_checkpoint(tmp_path / "ckpt", step=1, metadata={"note": "kept"})
    assert not (tmp_path / "off" / "checkpoints" / "step-2").exists()
