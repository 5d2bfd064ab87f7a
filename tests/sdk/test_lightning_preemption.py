"""A stop signal during a Lightning fit with ``MadoResume`` and ``MadoLogger``: a complete Checkpoint at the next step
boundary that records the signal, exit 128 + the signal number, a ``preempted`` Run; resumed from that checkpoint
the fit ends byte-identical (docs/design/runs.md#preemption; docs/design/resume.md#exact-resume)."""

import json
import signal
import sys

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking.integrations.lightning import MadoLogger
from runs.models import Run, RunStatus
from tests.sdk.lightning_fits import EXAMPLE_PATH, SignalAt, fit, restore_torch_globals, weights
from tests.sdk.programs import signal_once_ready


@pytest.fixture(autouse=True)
def _torch_globals():
    restore = restore_torch_globals()
    yield
    restore()


def _preempted_offline(tmp_path, *, late: bool, signum=signal.SIGTERM):
    """Fit offline, signalled at global step 5; return the SystemExit code, the run record and its checkpoints dir."""
    previous = signal.getsignal(signum)
    logger = MadoLogger(offline=True, output=tmp_path / "run")
    with pytest.raises(SystemExit) as exited:
        fit(tmp_path / "ckpt", logger=logger, callbacks=[SignalAt(5, late=late, signum=signum)])
    assert signal.getsignal(signum) == previous  # the handlers are back as they were before the fit
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    return exited.value.code, record, tmp_path / "run" / "checkpoints"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_signal_saves_the_next_step_boundary_and_exits_preempted(tmp_path, signum):
    code, record, checkpoints = _preempted_offline(tmp_path, late=False, signum=signum)
    assert code == 128 + signum
    assert record["status"] == "preempted"
    [saved] = record["checkpoints"]  # none of ModelCheckpoint's yet (every 10 steps)
    assert saved["step"] == 6 and saved["framework"] == "lightning" and saved["includes_optimizer"]
    assert saved["metadata"]["preemption"]["signal"] == signal.Signals(signum).name
    state = saved["metadata"]["training_state"]
    assert state["global_step"] == 6 and {"model", "optimizer", "rng.torch", "data_position"} <= set(state["parts"])
    assert [path.name for path in (checkpoints / "step-6").iterdir()] == ["preempted-epoch=0-step=6.ckpt"]


def test_resumed_from_the_preemption_checkpoint_the_fit_ends_byte_identical(tmp_path):
    reference = weights(fit(tmp_path / "reference"))
    _code, _record, checkpoints = _preempted_offline(tmp_path / "preempted", late=False)
    resumed = fit(tmp_path / "resumed", ckpt_path=checkpoints / "step-6" / "preempted-epoch=0-step=6.ckpt")
    assert weights(resumed) == reference


def test_when_lightning_stops_first_on_sigterm_the_checkpoint_is_saved_and_the_exit_is_still_preempted(tmp_path):
    # the signal arrives after MadoResume's check of that batch: Lightning raises its SIGTERMException at the
    # end of the batch (exit status 0 on its own), MadoResume saves from on_exception and makes it 143
    code, record, _checkpoints = _preempted_offline(tmp_path, late=True)
    assert code == 143
    assert record["status"] == "preempted"
    [saved] = record["checkpoints"]
    assert saved["step"] == 6 and saved["metadata"]["preemption"]["signal"] == "SIGTERM"


@pytest.mark.django_db(transaction=True)
def test_sigterm_to_the_example_online_leaves_a_complete_checkpoint_and_a_preempted_run(mmt_env, tmp_path):
    argv = [sys.executable, str(EXAMPLE_PATH), "--step-seconds", "0.1"]
    child = signal_once_ready(argv, env=mmt_env, cwd=tmp_path, ready="training from step")
    assert child.returncode == 143, child.stderr
    run = Run.objects.get()
    assert run.status == RunStatus.PREEMPTED
    [checkpoint] = Checkpoint.objects.filter(run=run)
    assert checkpoint.state == CheckpointState.COMPLETE and 1 <= checkpoint.step < 40
    assert checkpoint.framework == "lightning" and checkpoint.metadata["preemption"]["signal"] == "SIGTERM"
    assert checkpoint.metadata["training_state"]["global_step"] == checkpoint.step
    assert 0 <= checkpoint.signal_to_complete_s < 60
