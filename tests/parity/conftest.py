"""A failed parent Run with a checkpoint at step 20 and a child Run started from it, and ``log`` to store points
through the real ingest (``metrics_ingest``) with the after-commit hooks run, as a request's commit runs them."""

import math

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from runs.metrics import metrics_ingest
from runs.models import RunStatus
from tests.factories import RunFactory

KEYS = ("train.accuracy", "train.loss")
CHECKPOINT_STEP = 20


def curve(key: str, step: int) -> float:
    """What an uninterrupted run logs for ``key`` at ``step`` (irrational-looking floats: bits matter)."""
    return 2.3 * 0.93**step + math.sin(step) / 97 if key == "train.loss" else 1 - 0.9 * 0.95**step


@pytest.fixture
def log(django_capture_on_commit_callbacks):
    """``log(run, steps, keys=KEYS, value=curve)``: one batch of ``run`` through ``metrics_ingest`` (as its
    creator), its after-commit hooks run."""

    def send(run, steps, keys=KEYS, value=curve):
        columns = {"keys": [], "steps": [], "values": []}
        for step in steps:
            for key in keys:
                columns["keys"].append(key)
                columns["steps"].append(step)
                columns["values"].append(value(key, step))
        with django_capture_on_commit_callbacks(execute=True):
            return metrics_ingest(actor=run.created_by, run=run, columns=columns)

    return send


@pytest.fixture
def parent(project, creator):
    return RunFactory(project=project, created_by=creator, name="failed-at-27", status=RunStatus.FAILED)


@pytest.fixture
def source_checkpoint(parent):
    return Checkpoint.objects.create(
        run=parent, step=CHECKPOINT_STEP, state=CheckpointState.COMPLETE, file_count=1, total_bytes=10
    )


@pytest.fixture
def child(project, creator, parent, source_checkpoint):
    return RunFactory(
        project=project, created_by=creator, name="resumed", parent=parent, source_checkpoint=source_checkpoint
    )
