"""A preempted Job resumes by itself (docs/design/resume.md#restarts), end to end with real processes: gunicorn, a
real Celery worker on the embedded broker, and ``examples/training.py`` run by the worker as a Job launched with
``mado job launch --max-restarts 2``.

Twice, once the running Run saved a checkpoint and logged a step past it, the test sends the code SIGTERM (a
preemption notice): the example saves the step it reached and exits as preempted, the Job ends ``preempted``, and the
server resumes it from that checkpoint after the backoff. The third Job runs to the end and succeeds; each resumed
Run restored every part of its checkpoint and logs on from its step; the final weights are byte-identical to an
uninterrupted offline run; the Jobs link their restarts and the reliability ledger counts both preemptions.

The example logs each step 0.2 s later here (``slow_steps.py``, pushed with it) so the test can signal it mid-run.
"""

import os
import shlex
import shutil
import signal
import time
from contextlib import closing
from pathlib import Path

from tests.deployment import ROOT, deployment
from tests.jobs.test_job_flow import EXAMPLE_ARGS, example_offline, metric_steps

SLOW_STEPS = '''"""examples/training.py with each step's metrics logged 0.2 s later: the test's window to preempt it."""
import runpy
import sys
import time

from mado_tracking.run import Run

log_metrics = Run.log_metrics


def slow(self, *args, **kwargs):
    time.sleep(0.2)
    return log_metrics(self, *args, **kwargs)


Run.log_metrics = slow
sys.argv = ["training.py", *sys.argv[1:]]
runpy.run_path("training.py", run_name="__main__")
'''
TIMEOUT_S = 240.0


def wait_until(what: str, check, diagnose):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting until {what}\n{diagnose()}")


def code_pid(marker: str) -> int | None:
    """The pid of the Job's code: the ``python slow_steps.py`` process whose command line holds ``marker``."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and b"slow_steps.py" in argv and marker.encode() in argv:
            return int(entry.name)
    return None


def test_a_job_preempted_twice_resumes_by_itself_and_ends_with_the_uninterrupted_weights(tmp_path):
    reference = example_offline(tmp_path / "offline" / "weights.json")
    code = tmp_path / "code"
    shutil.copytree(ROOT / "examples", code, ignore=shutil.ignore_patterns("__pycache__"))
    (code / "slow_steps.py").write_text(SLOW_STEPS)
    weights = tmp_path / "job-weights.json"
    entrypoint = shlex.join(["python", "slow_steps.py", *EXAMPLE_ARGS, "--output", str(weights)])
    with deployment(tmp_path, MADO_JOB_RESTART_BACKOFF_S="1") as site, closing(site.client()) as client:
        pushed = site.mado("code", "push", code, "--project", "flow", "--name", "example", "--entrypoint", entrypoint)
        assert pushed.exit_code == 0, pushed.output
        launched = site.mado(
            "job", "launch", "--project", "flow", "--code-version", "example:1", "--queue", site.queue,
            "--max-restarts", "2", "--name", "spot", "-q",
        )  # fmt: skip
        assert launched.exit_code == 0, launched.output
        chain, stopped_at = [int(launched.output)], []
        for _preemption in range(2):
            job = client.request("GET", f"jobs/{chain[-1]}/")

            def past_a_checkpoint(run_id=job["run_id"], after=stopped_at[-1] if stopped_at else 0):
                saved = client.request("GET", f"runs/{run_id}/checkpoints/")["results"]
                steps = [c["step"] for c in saved if c["state"] == "complete" and c["step"] > after]
                return steps and max(metric_steps(client, run_id)) > max(steps) and code_pid(str(weights))

            os.kill(wait_until(f"job {chain[-1]} saves a checkpoint", past_a_checkpoint, site.logs), signal.SIGTERM)
            ended = wait_until(
                f"job {chain[-1]} ends preempted and restarts",
                lambda: (found := client.request("GET", f"jobs/{chain[-1]}/"))["restart_id"] and found,
                site.logs,
            )
            assert (ended["status"], ended["run_status"], ended["restarts"]) == (
                "preempted",
                "preempted",
                len(chain) - 1,
            )
            stopped = max(c["step"] for c in client.request("GET", f"runs/{ended['run_id']}/checkpoints/")["results"])
            stopped_at.append(stopped)
            chain.append(ended["restart_id"])

        final = wait_until(
            f"job {chain[-1]} ends",
            lambda: (
                (found := client.request("GET", f"jobs/{chain[-1]}/"))["status"] not in ("queued", "running") and found
            ),
            site.logs,
        )
        assert final["status"] == "succeeded", site.logs()
        jobs = [client.request("GET", f"jobs/{job_id}/") for job_id in chain]
        assert [j["restarts"] for j in jobs] == [0, 1, 2] and [j["max_restarts"] for j in jobs] == [2, 2, 2]
        assert [j["restart_of_id"] for j in jobs] == [None, chain[0], chain[1]]
        assert [j["source_checkpoint_step"] for j in jobs] == [None, *stopped_at]
        assert 10 <= stopped_at[0] < stopped_at[1] < 40
        for job, step in zip(jobs[1:], stopped_at, strict=True):
            run = client.request("GET", f"runs/{job['run_id']}/")
            report, parity = run["restore_report"], run["parity"]
            assert (report["not_restored"], report["unknown"], run["resume_ignored_at_step"]) == ([], [], None)
            # The preempted Run saved the step it reached and logged nothing past it: no overlap to compare, so the
            # exactness shows in the final weights below.
            assert (parity["checkpoint_step"], parity["compared_steps"]) == (step, 0)
            assert metric_steps(client, run["id"])[0] == step
        ledger = client.request("GET", "projects/flow/reliability/")["ledger"]
        assert sorted((lost["run_id"], lost["status"]) for lost in ledger) == [
            (jobs[0]["run_id"], "preempted"),
            (jobs[1]["run_id"], "preempted"),
        ]
    assert reference.wait(timeout=300) == 0, reference.stdout.read().decode()
    assert weights.read_bytes() == (tmp_path / "offline" / "weights.json").read_bytes()
