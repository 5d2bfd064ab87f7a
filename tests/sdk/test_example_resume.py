"""``examples/training.py`` fails part-way and, resumed from a checkpoint, ends with exactly the weights of an
uninterrupted run (docs/design/interfaces.md#example-program; docs/design/checkpoints.md#a-checkpoint;
docs/design/resume.md#steps-continue, #in-the-code; docs/design/runs.md#offline): offline, and online against a live
server."""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import requests

from checkpoints.models import Checkpoint, CheckpointState
from runs.models import MetricPoint, Run, RunStatus

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "training.py"
ARGS = ["--steps", "40", "--checkpoint-every", "10"]


def _example(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MMT_")}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _resume_env(directory: Path, info_dir: Path, checkpoint_id, source_run_id, step: int = 20) -> dict:
    info = info_dir / "resume-checkpoint.json"
    info.write_text(json.dumps({"checkpointId": checkpoint_id, "sourceRunId": source_run_id, "step": step}))
    return {
        "MMT_RESUME_CHECKPOINT_DIR": str(directory),
        "MMT_RESUME_STEP": str(step),
        "MMT_RESUME_CHECKPOINT_FILE": str(info),
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> bytes:
    """The weights file of an uninterrupted offline 40-step run."""
    output = tmp_path_factory.mktemp("uninterrupted") / "weights.json"
    done = _example("--offline", *ARGS, "--output", str(output))
    assert done.returncode == 0, done.stderr
    return output.read_bytes()


def test_offline_a_run_failing_at_step_27_resumed_from_step_20_ends_with_the_uninterrupted_weights(
    tmp_path, uninterrupted
):
    out = tmp_path / "x"
    failed = _example("--offline", *ARGS, "--fail-at-step", "27", "--output", str(out / "weights.json"))
    assert failed.returncode != 0
    assert "--fail-at-step 27" in failed.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10", "step-20"]
    assert not (out / "weights.json").exists()

    resumed = _example(
        "--offline",
        *ARGS,
        "--output",
        str(out / "resumed.json"),
        env=_resume_env(out / "checkpoints" / "step-20", tmp_path, "local", "local"),
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "resumed.json").read_bytes() == uninterrupted
    steps = [
        json.loads(line)["step"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["key"] == "train.loss"
    ]
    assert steps == [*range(27), *range(20, 40)]  # the resumed attempt continues at 20, never restarts at 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10", "step-20", "step-30", "step-40"]
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "finished" and [a["status"] for a in record["attempts"]] == ["failed", "finished"]


def test_the_same_seed_gives_the_same_weights_file(tmp_path, uninterrupted):
    done = _example("--offline", *ARGS, "--output", str(tmp_path / "again.json"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "again.json").read_bytes() == uninterrupted
    weights = json.loads(uninterrupted)
    assert list(weights) == ["0.weight", "0.bias", "2.weight", "2.bias"] and len(weights["0.weight"]) == 64 * 64


@pytest.mark.one_database  # on PostgreSQL: tests/integration/test_job_flow.py
@pytest.mark.django_db(transaction=True)
def test_online_checkpoints_are_stored_complete_and_a_downloaded_one_resumes_to_the_same_weights(
    mmt_env, tmp_path, uninterrupted
):
    failed = _example(*ARGS, "--fail-at-step", "27", "--name", "first", env=mmt_env)
    assert failed.returncode != 0
    source = Run.objects.get(name="first")
    assert source.status == RunStatus.FAILED
    saved = {c.step: c for c in Checkpoint.objects.filter(run=source)}
    assert sorted(saved) == [10, 20] and all(c.state == CheckpointState.COMPLETE for c in saved.values())
    assert all((c.framework, c.includes_optimizer) == ("torch", True) for c in saved.values())
    assert max(MetricPoint.objects.filter(run=source, key="train.loss").values_list("step", flat=True)) == 26

    checkpoint = saved[20]
    answer = requests.get(
        f"{mmt_env['MMT_API_URL']}/api/v1/checkpoints/{checkpoint.pk}/tar",
        headers={"Authorization": f"Bearer {mmt_env['MMT_API_TOKEN']}"},
        timeout=60,
    )
    assert answer.status_code == 200
    assert hashlib.sha256(answer.content).hexdigest() == checkpoint.tar_sha256
    (tmp_path / "step-20.tar").write_bytes(answer.content)
    extracted = tmp_path / "extracted"
    with tarfile.open(tmp_path / "step-20.tar") as tar:
        tar.extractall(extracted, filter="data")
    files = sorted(p for p in extracted.rglob("*") if p.is_file())
    assert [
        {
            "path": p.relative_to(extracted).as_posix(),
            "size": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in files
    ] == list(checkpoint.manifest.order_by("path").values("path", "size", "sha256"))
    assert {p.name for p in files} == {
        *("model.pt", "optimizer.pt", "scheduler.pt", "rng.pt", "data_position.pt", "mado-checkpoint.json", "data.json")
    }

    env = {**mmt_env, **_resume_env(extracted, tmp_path, checkpoint.pk, source.pk)}
    resumed = _example(*ARGS, "--name", "resumed", "--output", str(tmp_path / "weights.json"), env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "weights.json").read_bytes() == uninterrupted
    run = Run.objects.get(name="resumed")
    assert run.status == RunStatus.FINISHED
    steps = list(MetricPoint.objects.filter(run=run, key="train.loss").order_by("step").values_list("step", flat=True))
    assert steps == list(range(20, 40))
    assert sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [30, 40]


def test_a_checkpoint_at_the_last_step_says_there_is_nothing_to_train(tmp_path):
    offline = tmp_path / "offline"
    assert _example("--offline", *ARGS, "--output", str(offline / "weights.json")).returncode == 0
    env = _resume_env(offline / "checkpoints" / "step-40", tmp_path, "local", "local", step=40)
    again = _example("--offline", *ARGS, "--output", str(tmp_path / "again" / "weights.json"), env=env)
    assert again.returncode == 0, again.stderr
    assert "nothing to train: the checkpoint is at step 40 and the run has 40 steps" in again.stdout
