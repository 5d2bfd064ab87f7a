"""``examples/training.py --variant`` breaks its own resume the ways training loops do; the SDK names the part it
did not restore before the first step, and the curves part at the step where it matters
(docs/design/checkpoints.md#restore-check; docs/design/interfaces.md#example-program)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mado_tracking.parity import compare

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "training.py"
ARGS = ["--offline", "--steps", "30", "--checkpoint-every", "10"]


VARIANTS = (None, "rebuild-scheduler", "reseed-rng", "restart-data", "ignore-checkpoint")


def _environment(env: dict | None = None) -> dict:
    return {**{key: value for key, value in os.environ.items() if not key.startswith("MMT_")}, **(env or {})}


def _series(lines: list[str]) -> dict:
    found = {}
    for line in lines:
        point = json.loads(line)
        found.setdefault(point["key"], {})[point["step"]] = point["value"]
    return found


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> dict:
    """``{variant: (stderr, parent's series, child's series)}``: an offline run of the example fails at step 27
    (checkpoints at 10 and 20), then each variant resumes a copy of it from step 20, all at once."""
    failed = tmp_path_factory.mktemp("failed")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *ARGS, "--fail-at-step", "27", "--output", str(failed / "weights.json")],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    info = failed.parent / "resume.json"
    info.write_text(json.dumps({"checkpointId": 12, "sourceRunId": "local", "step": 20}))
    running = {}
    for variant in VARIANTS:
        out = tmp_path_factory.mktemp(variant or "plain")
        shutil.copytree(failed, out, dirs_exist_ok=True)
        env = {
            "MMT_RESUME_CHECKPOINT_DIR": str(out / "checkpoints" / "step-20"),
            "MMT_RESUME_STEP": "20",
            "MMT_RESUME_CHECKPOINT_FILE": str(info),
        }
        argv = [sys.executable, str(EXAMPLE), *ARGS, *(["--variant", variant] if variant else [])]
        process = subprocess.Popen(
            [*argv, "--output", str(out / "r.json")],
            env=_environment(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        running[variant] = (process, out)
    found = {}
    for variant, (process, out) in running.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        lines = (out / "metrics.jsonl").read_text().splitlines()
        found[variant] = (stderr, _series(lines[: 27 * 2]), _series(lines[27 * 2 :]))
    return found


@pytest.mark.parametrize(
    ("variant", "named", "diverged_at"),
    [
        (None, None, None),
        ("rebuild-scheduler", ["scheduler — the scheduler restored from the checkpoint was dropped"], 21),
        ("reseed-rng", ["rng.torch — re-seeded with 0 after load", "generator.batches — the generator"], 20),
        ("restart-data", ["data_position — went back from 1797, 0, 1280 at the load to 1797, 0, 64"], 20),
        ("ignore-checkpoint", ["loaded no checkpoint with mado_tracking.torch.load_checkpoint"], 20),
    ],
)
def test_each_variant_is_named_before_its_first_step_and_parts_where_expected(resumed, variant, named, diverged_at):
    stderr, parent, child = resumed[variant]
    assert sorted(child["train.loss"]) == list(range(20, 30))
    verdict = compare(parent, child, from_step=20, tolerance=0)
    if variant is None:
        assert "WARNING" not in stderr
        assert (verdict["verdict"], verdict["compared_steps"]) == ("identical", 7)
        return
    [warning] = [line for line in stderr.splitlines() if "mado: WARNING" in line]
    if variant != "ignore-checkpoint":
        assert warning.startswith("mado: WARNING: not restored from checkpoint 12 (step 20): ")
    assert all(part in warning for part in named), warning
    assert (verdict["verdict"], verdict["step"]) == ("diverged", diverged_at)
