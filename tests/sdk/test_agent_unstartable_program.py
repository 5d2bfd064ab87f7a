"""``mado agent`` with a sweep program this machine cannot start: a W&B habit such as
``program: train.py`` (no interpreter) must not make the agent fail every trial of the sweep in a loop."""

import os
import subprocess
import sys
from pathlib import Path

from tests.sdk.sweep_stub import TOKEN, SweepStub

MADO = str(Path(sys.executable).parent / "mado")


def trial(number: int) -> dict:
    return {
        "trial": {
            "number": number,
            "parameters": {"lr": 0.01},
            "run_id": 100 + number,
            "external_id": f"trial-{number}",
            "requeue_count": 0,
            "lease_expires_at": None,
            "latest_checkpoint": None,
        },
        "done": False,
    }


def test_a_program_that_cannot_start_requeues_its_trial_and_stops_the_agent(tmp_path):
    missing = str(tmp_path / "train.py")  # not there: Popen raises FileNotFoundError
    with SweepStub(program=[missing], claims=[trial(1), trial(2), trial(3)]) as api:
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MMT_")},
            "MMT_API_URL": api.url,
            "MMT_API_TOKEN": TOKEN,
        }
        agent = subprocess.run(
            [MADO, "agent", "7", "--poll-interval", "0.05"], env=environment, capture_output=True, text=True, timeout=60
        )
        reports, agents = list(api.reports), list(api.agents)
    assert agent.returncode == 1, agent.stderr
    assert f"trial 1: cannot start {missing!r}" in agent.stderr
    assert "the trial goes back to the queue and this agent stops" in agent.stderr
    assert "'python train.py'" in agent.stderr
    # Reported as preempted before its Run started: the server requeues the trial and leaves the Run pending.
    assert reports == [(1, {"exit_code": 127, "preempted": True, "agent": agents[0]})]
    assert len(agents) == 1  # no further trial claimed
