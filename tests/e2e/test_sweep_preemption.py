"""End to end (docs/design/runs.md#resume-modes, #one-writer-process, #states; docs/design/sweeps.md#sweeps, #requeue):
a grid sweep of 4 trials run by `mado agent` processes against a real deployment (gunicorn on a fresh SQLite file,
tests/deployment.py), one trial preempted mid-way.

Two agents (`--forward-signals`) run ``examples/sweep_training.py``. Once a trial of the first agent has
saved its first checkpoint (step 10), the first agent gets SIGTERM: it passes it on, the program marks its
Run preempting, checkpoints at the step it reached (past 10) and exits 1, the Run ends ``preempted``, the trial goes
back to the queue and the agent stops (143). A third agent is started; the requeued trial is claimed before
the remaining parameter sets and resumes under its own run id from that checkpoint. In the end all 4 trials
are done and finished; the preempted one is the same Run (resumed once, requeued once) whose metric steps
run 0..N-1 exactly once, and no Run dropped a point (a restart from step 0 would have re-logged steps below
its floor) or was resumed except the preempted one.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from mado_tracking.client import ApiClient
from tests.deployment import ROOT, Deployment, deployment

STEPS = 40
FIRST_CHECKPOINT = 10
MADO = str(Path(sys.executable).parent / "mado")
CONFIG = {
    "name": "digits-e2e",
    "method": "grid",
    "metric": {"name": "val_loss", "goal": "minimize"},
    "parameters": {"lr": {"values": [0.01, 0.1]}, "hidden": {"values": [32, 64]}},
    "program": f"python {ROOT / 'examples' / 'sweep_training.py'} --steps {STEPS} --checkpoint-every 10 "
    "--step-seconds 0.1",
}


def start_agent(site: Deployment, sweep_id: int, work: Path, name: str) -> subprocess.Popen:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MMT_")},
        "MMT_API_URL": site.url,
        "MMT_API_TOKEN": site.token,
        "PYTHONUNBUFFERED": "1",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
    }
    with open(work / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [MADO, "agent", str(sweep_id), "--forward-signals", "--poll-interval", "0.2", "--kill-grace", "20"],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_until(what: str, check, timeout: float = 120.0, diagnose=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s\n{diagnose()}"
        time.sleep(0.1)


def loss_points(client: ApiClient, run_id: int) -> list[dict]:
    page = client.request("GET", f"runs/{run_id}/metrics/", params={"key": "loss", "page_size": 1000})
    return page["results"]


def loss_steps(client: ApiClient, run_id: int) -> list[int]:
    return [point["step"] for point in loss_points(client, run_id)]


def test_a_grid_sweep_with_a_preempted_trial_finishes_every_trial_once_resuming_the_preempted_one(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "sweep.json").write_text(json.dumps(CONFIG))
    agents: list[subprocess.Popen] = []

    def logs() -> str:
        return (
            "\n".join(
                f"--- {path.name} ---\n{path.read_text(errors='replace')[-4000:]}"
                for path in sorted(work.glob("*.log"))
            )
            + "\n"
            + site.logs()
        )

    with deployment(tmp_path / "site") as site, closing(site.client()) as client:
        created = site.mado("sweep", "create", work / "sweep.json", "--project", "flow", "-q")
        assert created.exit_code == 0, created.output
        sweep_id = int(created.output)
        try:
            agents += [start_agent(site, sweep_id, work, "agent-1"), start_agent(site, sweep_id, work, "agent-2")]
            first = f"{socket.gethostname()}:{agents[0].pid}"

            def first_agents_trial_with_a_checkpoint():
                for trial in client.request("GET", f"sweeps/{sweep_id}/")["trials"]:
                    if trial["agent"] == first and trial["state"] == "running":
                        saved = client.request("GET", f"runs/{trial['run_id']}/checkpoints/")["results"]
                        # A checkpoint is listed from its registration on (pending): wait until it is complete and
                        # the program logged a step past it, so the SIGTERM cannot land inside the step-10 save.
                        if (
                            saved
                            and saved[0]["state"] == "complete"
                            and max(loss_steps(client, trial["run_id"]), default=-1) >= FIRST_CHECKPOINT
                        ):
                            return trial
                return None

            target = wait_until(
                f"a trial of agent 1 saves its checkpoint at step {FIRST_CHECKPOINT}",
                first_agents_trial_with_a_checkpoint,
                diagnose=logs,
            )
            agents[0].send_signal(signal.SIGTERM)
            assert agents[0].wait(timeout=30) == 128 + signal.SIGTERM, logs()
            first_stopped = time.time()
            preempted = client.request("GET", f"runs/{target['run_id']}/")
            assert preempted["status"] == "preempted", logs()

            agents.append(start_agent(site, sweep_id, work, "agent-3"))
            for agent in agents[1:]:
                assert agent.wait(timeout=180) == 0, logs()
        finally:
            for agent in agents:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()

        sweep = client.request("GET", f"sweeps/{sweep_id}/")
        trials = {trial["number"]: trial for trial in sweep["trials"]}
        assert sorted(trials) == [1, 2, 3, 4]
        assert {(t["state"], t["run_status"]) for t in trials.values()} == {("done", "finished")}, logs()
        assert sweep["best_trial"] in trials
        resumed = trials[target["number"]]
        assert (resumed["run_id"], resumed["external_id"], resumed["requeue_count"]) == (
            target["run_id"],
            target["external_id"],
            1,
        )

        resume_line = re.search(
            rf"^trial {target['number']}: resuming run {target['external_id']} from checkpoint "
            r"(\d+) \(step (\d+)\)$",
            logs(),
            re.M,
        )
        assert resume_line, logs()
        checkpoint_id, step = int(resume_line.group(1)), int(resume_line.group(2))
        assert FIRST_CHECKPOINT < step < STEPS  # the checkpoint the program saved when it was preempted
        assert f"resuming run {target['external_id']} from checkpoint {checkpoint_id} at step {step}" in logs()
        points = loss_points(client, target["run_id"])
        assert all(p["timestamp"] < first_stopped for p in points if p["step"] < step)  # logged before SIGTERM,
        assert all(p["timestamp"] > first_stopped for p in points if p["step"] >= step)  # the rest after the resume
        for trial in trials.values():
            run = client.request("GET", f"runs/{trial['run_id']}/")
            expected_resumes = 1 if trial["number"] == target["number"] else 0
            assert (run["resume_count"], run["dropped_points"]) == (expected_resumes, 0), (trial, run)
            assert loss_steps(client, trial["run_id"]) == list(range(STEPS)), trial  # each step once, none lost
