"""``examples/training.py`` trains for real and logs every step through the SDK
(docs/design/interfaces.md#example-program; docs/design/resume.md#steps-continue)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runs.models import MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "training.py"


def test_the_example_logs_loss_and_accuracy_for_every_step(mmt_env):
    env = {**os.environ, **mmt_env}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "5", "--name", "example"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run = Run.objects.get()
    assert (run.name, run.kind, run.status) == ("example", "training", RunStatus.FINISHED)
    assert run.parameters["steps"] == 5
    for key in ("train.loss", "train.accuracy"):
        points = MetricPoint.objects.filter(run=run, key=key).order_by("step")
        assert [p.step for p in points] == [0, 1, 2, 3, 4]
    losses = MetricPoint.objects.filter(run=run, key="train.loss").values_list("value", flat=True)
    assert all(0 < loss < 10 for loss in losses)
    accuracies = MetricPoint.objects.filter(run=run, key="train.accuracy").values_list("value", flat=True)
    assert all(0 <= accuracy <= 1 for accuracy in accuracies)
