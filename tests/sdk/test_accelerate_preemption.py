"""SIGTERM in the middle of ``examples/accelerate_training.py`` against a live server: a complete checkpoint saved
at the end of the step that records the signal, and a ``preempted`` Run (docs/design/runs.md#preemption;
docs/design/checkpoints.md#metadata; docs/integrations.md)."""

import os
import signal
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking.client import ApiClient
from mado_tracking.config import Config
from runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_training.py"


def test_sigterm_mid_training_saves_a_complete_checkpoint_with_the_signal_and_the_run_ends_preempted(mmt_env, tmp_path):
    child = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--steps", "1000000", "--name", "spot"],
        env={**os.environ, **mmt_env},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = child.stdout.readline()  # printed once the handler is installed, right before training
        assert started.startswith("run "), child.stderr.read()
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 128 + signal.SIGTERM, err[-3000:]
    run = Run.objects.get(name="spot")
    assert run.status == RunStatus.PREEMPTED
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.state == CheckpointState.COMPLETE and checkpoint.framework == "accelerate"
    assert f"saved step {checkpoint.step}, exiting as preempted" in err
    with closing(ApiClient(Config(api_url=mmt_env["MMT_API_URL"], api_token=mmt_env["MMT_API_TOKEN"]))) as client:
        resource = client.request("GET", f"checkpoints/{checkpoint.pk}/")
    assert resource["metadata"]["preemption"]["signal"] == "SIGTERM"
    assert resource["metadata"]["training_state"]["global_step"] == checkpoint.step
    assert 0 <= resource["signal_to_complete_s"] < 60
    assert {e["path"] for e in resource["manifest"]} >= {"model.safetensors", "optimizer.bin", "random_states_0.pkl"}
    assert not list(tmp_path.glob(".mado/cache/accelerate/*"))  # the local copy is gone once complete
