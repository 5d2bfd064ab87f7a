"""``examples/lightning_training.py`` started again under its run id (``MMT_RUN_ID``, ``MMT_RESUME=allow``) after a
failure: ``resume_ckpt_path(logger)`` fetches the Run's latest complete checkpoint and the fit ends byte-identical
to an uninterrupted one (docs/design/resume.md#resume-anywhere, #exact-resume)."""

import os
import subprocess
import sys

import pytest

from checkpoints.models import Checkpoint
from parity.models import RestoreReport
from runs.models import Run, RunStatus
from tests.sdk.lightning_fits import EXAMPLE_PATH


@pytest.mark.one_database  # on PostgreSQL: test_lightning_flow.py, same-run resume in test_resume_anywhere_ddp.py
@pytest.mark.django_db(transaction=True)
def test_a_same_run_resume_of_the_example_fetches_the_latest_checkpoint_and_ends_byte_identical(mmt_env, tmp_path):
    def example(*args, **env):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE_PATH), *args],
            env={**os.environ, **mmt_env, **env},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.returncode, done.stdout + done.stderr

    same_run = {"MMT_RUN_ID": "lightning-1", "MMT_RESUME": "allow"}
    assert example("--output", str(tmp_path / "reference.json"))[0] == 0
    code, output = example("--fail-at-step", "27", **same_run)
    assert code == 1, output
    code, output = example("--output", str(tmp_path / "resumed.json"), **same_run)
    assert code == 0, output
    assert "resuming from epoch=1-step=20.ckpt" in output
    assert (tmp_path / "resumed.json").read_bytes() == (tmp_path / "reference.json").read_bytes()
    run = Run.objects.get(external_id="lightning-1")
    assert run.status == RunStatus.FINISHED
    steps = sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True))
    assert steps == [10, 20, 30, 40]
    report = RestoreReport.objects.get(run=run)  # what the integration loaded: no "Resume ignored?"
    assert set(report.parts.values()) == {"restored"}, report.details
    assert Checkpoint.objects.get(pk=report.checkpoint_id).step == 20
