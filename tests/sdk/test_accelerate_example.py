"""``examples/accelerate_training.py`` fails part-way and, resumed from a read-only checkpoint in the middle of an
epoch, ends with exactly the weights of an uninterrupted run: offline in one process and in two, and against a live
server started again under its id (the checkpoint downloaded); SIGTERM in the middle gives a complete checkpoint
that records the signal and a ``preempted`` Run (docs/integrations.md; docs/design/resume.md#steps-continue,
#in-the-code, #resume-anywhere; docs/design/worker.md#distributed; docs/design/runs.md#preemption;
docs/design/checkpoints.md#metadata)."""

import hashlib
import json
import shutil
import signal
import sys
from contextlib import closing
from pathlib import Path

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking.client import ApiClient
from mado_tracking.config import Config
from parity.models import RestoreReport
from runs.models import MetricPoint, Run, RunStatus
from tests.sdk.programs import job_resume_variables, run_example, signal_once_ready

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_training.py"
ARGS = ["--offline", "--steps", "40", "--checkpoint-every", "10"]


def _example(*args: str, env: dict | None = None, launcher: tuple[str, ...] = (sys.executable,), cwd=None):
    return run_example(EXAMPLE, *args, env=env, cwd=cwd, launcher=launcher)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> bytes:
    """The weights file of an uninterrupted offline 40-step run."""
    output = tmp_path_factory.mktemp("reference") / "weights.safetensors"
    done = _example(*ARGS, "--output", str(output))
    assert done.returncode == 0, done.stderr
    return output.read_bytes()


def _read_only_copy(source: Path, target: Path) -> Path:
    """``source`` copied as a Job's worker extracts a checkpoint: files 0o444, the directory 0o555."""
    shutil.copytree(source, target)
    for path in target.iterdir():
        path.chmod(0o444)
    target.chmod(0o555)
    return target


def _resume_env(directory: Path, step: int) -> dict:
    info = directory.parent / f"resume-{step}.json"
    return job_resume_variables(directory, step, info, checkpoint_id="local", source_run_id="local")


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _loss_steps(run_dir: Path) -> list[int]:
    points = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [point["step"] for point in points if point["key"] == "train.loss"]


def test_failing_at_27_and_resumed_mid_epoch_from_20_it_ends_with_the_uninterrupted_weights(tmp_path, reference):
    out = tmp_path / "run"
    failed = _example(*ARGS, "--fail-at-step", "27", "--output", str(out / "weights.safetensors"))
    assert failed.returncode == 1 and "--fail-at-step 27" in failed.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10", "step-20"]

    checkpoint = _read_only_copy(out / "checkpoints" / "step-20", tmp_path / "extracted")
    before = _digests(checkpoint)
    resumed = _example(*ARGS, "--output", str(out / "resumed.safetensors"), env=_resume_env(checkpoint, 20))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step 20, epoch 3, batch 4" in resumed.stdout  # 40 batches of 12 an epoch
    assert (out / "resumed.safetensors").read_bytes() == reference
    assert _digests(checkpoint) == before
    assert _loss_steps(out) == [*range(27), *range(20, 40)]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10", "step-20", "step-30", "step-40"]
    assert "no data position" not in resumed.stderr and "use_seedable_sampler" not in resumed.stderr
    checkpoint.chmod(0o755)


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_two_processes_save_and_load_alike_and_resume_to_the_same_weights(tmp_path):
    torchrun = (str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2")
    args = ["--offline", "--steps", "8", "--checkpoint-every", "4"]
    uninterrupted = _example(*args, "--output", str(tmp_path / "a" / "w.safetensors"), launcher=torchrun, cwd=tmp_path)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    saved = tmp_path / "a" / "checkpoints" / "step-4"
    assert {"random_states_0.pkl", "random_states_1.pkl", "model.safetensors"} <= {p.name for p in saved.iterdir()}
    record = json.loads((tmp_path / "a" / "run.json").read_text())["checkpoints"][0]
    assert record["metadata"]["training_state"]["processes"] == 2
    checkpoint = _read_only_copy(saved, tmp_path / "extracted")
    resumed = _example(
        *args,
        "--output",
        str(tmp_path / "b" / "w.safetensors"),
        env=_resume_env(checkpoint, 4),
        launcher=torchrun,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step 4, epoch 1, batch 2" in resumed.stdout  # each process: 6 batches an epoch
    assert (tmp_path / "b" / "w.safetensors").read_bytes() == (tmp_path / "a" / "w.safetensors").read_bytes()
    checkpoint.chmod(0o755)


@pytest.mark.one_database  # the process stops itself; the database only records it
@pytest.mark.django_db(transaction=True)
def test_sigterm_mid_training_saves_a_complete_checkpoint_with_the_signal_and_the_run_ends_preempted(mmt_env, tmp_path):
    argv = [sys.executable, str(EXAMPLE), "--steps", "1000000", "--name", "spot"]
    # "run …" is printed once the handler is installed, right before training
    child = signal_once_ready(argv, env=mmt_env, cwd=tmp_path, ready="run ")
    err = child.stderr
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


@pytest.mark.one_database  # on PostgreSQL: test_accelerate_flow.py, same-run resume in test_resume_anywhere_ddp.py
@pytest.mark.django_db(transaction=True)
def test_started_again_under_its_id_the_run_resumes_mid_epoch_from_its_latest_checkpoint_to_the_same_weights(
    mmt_env, tmp_path, reference
):
    online = ["--steps", "40", "--checkpoint-every", "10"]
    same_run = {**mmt_env, "MMT_RUN_ID": "acc-spot", "MMT_RESUME": "allow"}
    (tmp_path / "first").mkdir()
    failed = _example(*online, "--fail-at-step", "27", env=same_run, cwd=tmp_path / "first")
    assert failed.returncode == 1, failed.stderr
    (tmp_path / "elsewhere").mkdir()  # another machine: nothing of the first start on its disk
    resumed = _example(*online, "--output", str(tmp_path / "w.safetensors"), env=same_run, cwd=tmp_path / "elsewhere")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step 20, epoch 3, batch 4" in resumed.stdout
    assert (tmp_path / "w.safetensors").read_bytes() == reference
    run = Run.objects.get(external_id="acc-spot")
    assert run.status == RunStatus.FINISHED
    assert sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [10, 20, 30, 40]
    steps = list(MetricPoint.objects.filter(run=run, key="train.loss").values_list("step", flat=True))
    assert sorted(set(steps)) == list(range(40))
    report = RestoreReport.objects.get(run=run)  # what the integration loaded: no "Resume ignored?"
    assert set(report.parts.values()) == {"restored"}, report.details
    assert Checkpoint.objects.get(pk=report.checkpoint_id).step == 20
    (segment,) = run.resume_segments.all()  # steps 20-26 trained again, compared with the first ones
    assert (segment.verdict, segment.checkpoint_step, segment.first_step) == ("identical", 20, 20), segment.key
