"""The Run parameters of ``mado probe-resume`` stop any code that logs through the SDK at a given step: failed for the
interrupted Job, finished for every Job's last step; a resumed Job runs on (docs/design/checkpoints.md#probe)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.sdk.stub_api import StubApi

SDK = Path(__file__).resolve().parents[2] / "sdk"
PROGRAM = textwrap.dedent(
    """
    import json, sys
    import mado_tracking
    parameters = json.loads(sys.argv[1])
    with mado_tracking.start_run(project="vision", parameters=parameters) as run:
        for step in range(10):
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    print("the loop ended")
    """
)


def _run(stub: StubApi, parameters: str, start_kind: str = "new") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMT_")}
    env.update(
        MMT_API_URL=stub.url,
        MMT_API_TOKEN="stub-token",
        MMT_START_KIND=start_kind,
        PYTHONPATH=os.pathsep.join([str(SDK), env.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, parameters], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_interrupted_job_fails_at_its_step_with_the_steps_before_it_sent():
    with StubApi() as stub:
        done = _run(stub, '{"lr": 0.1, "mado_probe_fail_at_step": 3}')
    assert done.returncode == 1, done.stderr
    assert "mado probe: stopping at step 3 as asked" in done.stdout and "the loop ended" not in done.stdout
    assert [p["step"] for p in stub.points] == [0, 1, 2]
    assert stub.statuses == ["failed"]


def test_the_resumed_job_copies_the_parameter_and_runs_on():
    with StubApi() as stub:
        done = _run(stub, '{"mado_probe_fail_at_step": 3}', start_kind="resume")
    assert done.returncode == 0, done.stderr
    assert len(stub.points) == 10 and stub.statuses == ["finished"]


def test_every_job_ends_finished_at_the_last_step_of_the_probe():
    with StubApi() as stub:
        done = _run(stub, '{"mado_probe_end_at_step": 5}', start_kind="resume")
    assert done.returncode == 0, done.stderr
    assert [p["step"] for p in stub.points] == [0, 1, 2, 3, 4] and stub.statuses == ["finished"]


@pytest.mark.parametrize("value", ["true", '"3"', "-1", "2.5", "null"])
def test_a_value_that_is_not_a_step_is_ignored(value):
    with StubApi() as stub:
        done = _run(stub, f'{{"mado_probe_fail_at_step": {value}, "mado_probe_end_at_step": {value}}}')
    assert done.returncode == 0, done.stderr
    assert len(stub.points) == 10
