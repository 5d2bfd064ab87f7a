"""``examples/accelerate_training.py`` against a live server: SIGTERM in the middle gives a complete checkpoint saved
at the end of the step that records the signal, and a ``preempted`` Run; a Run started again under its id resumes
from its latest checkpoint, downloaded, to the weights of an uninterrupted run (docs/design/runs.md#preemption;
docs/design/checkpoints.md#metadata; docs/design/resume.md#resume-anywhere; docs/integrations.md)."""

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
from runs.models import MetricPoint, Run, RunStatus

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


def _example(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MMT_")}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "40", "--checkpoint-every", "10", *args],
        env={**environment, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_started_again_under_its_id_the_run_resumes_mid_epoch_from_its_latest_checkpoint_to_the_same_weights(
    mmt_env, tmp_path
):
    reference = _example("--offline", "--output", str(tmp_path / "reference" / "w.safetensors"), env={}, cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr
    same_run = {**mmt_env, "MMT_RUN_ID": "acc-spot", "MMT_RESUME": "allow"}
    (tmp_path / "first").mkdir()
    failed = _example("--fail-at-step", "27", env=same_run, cwd=tmp_path / "first")
    assert failed.returncode == 1, failed.stderr
    (tmp_path / "elsewhere").mkdir()  # another machine: nothing of the first start on its disk
    resumed = _example("--output", str(tmp_path / "w.safetensors"), env=same_run, cwd=tmp_path / "elsewhere")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step 20, epoch 3, batch 4" in resumed.stdout
    assert (tmp_path / "w.safetensors").read_bytes() == (tmp_path / "reference" / "w.safetensors").read_bytes()
    run = Run.objects.get(external_id="acc-spot")
    assert run.status == RunStatus.FINISHED
    assert sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [10, 20, 30, 40]
    steps = list(MetricPoint.objects.filter(run=run, key="train.loss").values_list("step", flat=True))
    assert sorted(set(steps)) == list(range(40))
