"""``examples/accelerate_training.py`` fails part-way and, resumed from a read-only checkpoint in the middle of an
epoch, ends with exactly the weights of an uninterrupted run, in one process and in two (docs/integrations.md;
docs/design/resume.md#steps-continue, #in-the-code; docs/design/worker.md#distributed). Offline: no server."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_training.py"
ARGS = ["--offline", "--steps", "40", "--checkpoint-every", "10"]


def _example(*args: str, env: dict | None = None, launcher: tuple[str, ...] = (sys.executable,)):
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MMT_")}
    return subprocess.run(
        [*launcher, str(EXAMPLE), *args],
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _read_only_copy(source: Path, target: Path) -> Path:
    """``source`` copied as a Job's worker extracts a checkpoint: files 0o444, the directory 0o555."""
    shutil.copytree(source, target)
    for path in target.iterdir():
        path.chmod(0o444)
    target.chmod(0o555)
    return target


def _resume_env(directory: Path, step: int) -> dict:
    info = directory.parent / f"resume-{step}.json"
    info.write_text(json.dumps({"checkpointId": "local", "sourceRunId": "local", "step": step}))
    return {
        "MMT_RESUME_CHECKPOINT_DIR": str(directory),
        "MMT_RESUME_STEP": str(step),
        "MMT_RESUME_CHECKPOINT_FILE": str(info),
    }


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _loss_steps(run_dir: Path) -> list[int]:
    points = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [point["step"] for point in points if point["key"] == "train.loss"]


def test_failing_at_27_and_resumed_mid_epoch_from_20_it_ends_with_the_uninterrupted_weights(tmp_path):
    reference = _example(*ARGS, "--output", str(tmp_path / "reference" / "weights.safetensors"))
    assert reference.returncode == 0, reference.stderr
    out = tmp_path / "run"
    failed = _example(*ARGS, "--fail-at-step", "27", "--output", str(out / "weights.safetensors"))
    assert failed.returncode == 1 and "--fail-at-step 27" in failed.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10", "step-20"]

    checkpoint = _read_only_copy(out / "checkpoints" / "step-20", tmp_path / "extracted")
    before = _digests(checkpoint)
    resumed = _example(*ARGS, "--output", str(out / "resumed.safetensors"), env=_resume_env(checkpoint, 20))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step 20, epoch 3, batch 4" in resumed.stdout  # 40 batches of 12 an epoch
    assert (out / "resumed.safetensors").read_bytes() == (tmp_path / "reference" / "weights.safetensors").read_bytes()
    assert _digests(checkpoint) == before
    assert _loss_steps(out) == [*range(27), *range(20, 40)]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10", "step-20", "step-30", "step-40"]
    assert "no data position" not in resumed.stderr and "use_seedable_sampler" not in resumed.stderr
    checkpoint.chmod(0o755)


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_two_processes_save_and_load_alike_and_resume_to_the_same_weights(tmp_path):
    torchrun = (str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2")
    args = ["--offline", "--steps", "8", "--checkpoint-every", "4"]
    reference = _example(*args, "--output", str(tmp_path / "a" / "w.safetensors"), launcher=torchrun)
    assert reference.returncode == 0, reference.stderr[-3000:]
    saved = tmp_path / "a" / "checkpoints" / "step-4"
    assert {"random_states_0.pkl", "random_states_1.pkl", "model.safetensors"} <= {p.name for p in saved.iterdir()}
    record = json.loads((tmp_path / "a" / "run.json").read_text())["checkpoints"][0]
    assert record["metadata"]["training_state"]["processes"] == 2
    checkpoint = _read_only_copy(saved, tmp_path / "extracted")
    resumed = _example(
        *args, "--output", str(tmp_path / "b" / "w.safetensors"), env=_resume_env(checkpoint, 4), launcher=torchrun
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step 4, epoch 1, batch 2" in resumed.stdout  # each process: 6 batches an epoch
    assert (tmp_path / "b" / "w.safetensors").read_bytes() == (tmp_path / "a" / "w.safetensors").read_bytes()
    checkpoint.chmod(0o755)
