"""``examples/lightning_training.py`` started again under its run id (``MMT_RUN_ID``, ``MMT_RESUME=allow``) after a
failure: ``resume_ckpt_path(logger)`` fetches the Run's latest complete checkpoint and the fit ends byte-identical
to an uninterrupted one, its replayed steps identical to the first ones; resumed as Lightning does alone
(``--plain``) they diverge, and the restore report names the data position and the RNGs
(docs/design/resume.md#resume-anywhere, #exact-resume, #same-run-parity)."""

import os
import subprocess
import sys

import pytest

from checkpoints.models import Checkpoint
from parity.models import RestoreReport
from runs.models import ResumeSegment, Run, RunStatus
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
    # the steps logged again from the checkpoint are compared with the first ones
    segment = ResumeSegment.objects.get(run=run)
    assert (segment.verdict, segment.checkpoint_step, segment.first_step) == ("identical", 20, 20), segment.key
    assert set(segment.restore_parts.values()) == {"restored"}

    # Lightning alone (the logger, no MadoResume, a plain shuffled loader): the replay diverges, and the restore
    # report says why: the data position and the RNGs were not restored
    plain = {"MMT_RUN_ID": "lightning-plain", "MMT_RESUME": "allow"}
    code, output = example("--plain", "--fail-at-step", "27", **plain)
    assert code == 1, output
    code, output = example("--plain", **plain)
    assert code == 0, output
    segment = ResumeSegment.objects.get(run__external_id="lightning-plain")
    assert (segment.verdict, segment.checkpoint_step) == ("diverged", 20), segment.verdict
    assert 20 <= segment.step <= 26 and segment.parent_value != segment.child_value
    assert {"data_position", "rng.python", "rng.numpy", "rng.torch"} <= set(segment.not_restored), segment.restore_parts
