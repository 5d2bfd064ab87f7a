"""End to end with real processes (docs/design/resume.md; docs/design/worker.md; docs/design/runs.md#offline;
docs/design/interfaces.md#example-program): a web server (gunicorn), a real Celery worker on the embedded filesystem
broker, and ``examples/training.py`` run by the worker as a Job.

``mado code push`` registers ``examples/`` twice (a version that fails at step 27 and one that does not),
``mado job launch`` starts the first: it saves checkpoints 10 and 20 and fails at 27; ``mado job resume
--latest`` (``POST jobs/{id}/resume-latest/`` → ``job_resume_from_latest``) resumes it on the second
version; the resumed Job succeeds, its Run's parent is the failed Run and its source checkpoint step 20,
its metric steps start at 20, its parity verdict is ``identical`` over steps 20..26 on every key (API and ``mado
job show``), and its final weights are byte-identical to an uninterrupted offline run.

Every process, this test's included, talks to one deployment in a fresh ``MADO_DATA_DIR``: pytest-django's
test database is private to the test process, so the server runs out of process on a migrated SQLite file and
the test reads everything through the API. ``tests/integration/test_job_flow.py``
runs the same flow on PostgreSQL and a Redis broker. ``test_make_demo_…`` runs ``manage.py demo`` (about
20 s; kept in the suite because it is the README's first command).
"""

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from mado_tracking.client import ApiClient
from tests.deployment import ROOT, Deployment, deployment, deployment_env, free_port

EXAMPLE_ARGS = ["--steps", "40", "--checkpoint-every", "10"]
JOB_TIMEOUT_S = "300"


def example_offline(output: Path) -> subprocess.Popen:
    """The uninterrupted 40-step run of the example, offline (no server): its weights are the reference."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMT_")}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "training.py"), "--offline", *EXAMPLE_ARGS, "--output", str(output)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def metric_steps(client: ApiClient, run_id: int, key: str = "train.loss") -> list[int]:
    page = client.request("GET", f"runs/{run_id}/metrics/", params={"key": key, "page_size": 1000})
    return [point["step"] for point in page["results"]]


def run_the_flow(site: Deployment, directory: Path) -> None:
    """The scenario of the module docstring against ``site``; asserts every step."""
    reference = example_offline(directory / "offline" / "weights.json")
    resumed_weights = directory / "resumed-weights.json"
    failing_entrypoint = shlex.join(["python", "training.py", *EXAMPLE_ARGS, "--fail-at-step", "27"])
    fixed_entrypoint = shlex.join(["python", "training.py", *EXAMPLE_ARGS, "--output", str(resumed_weights)])
    for entrypoint in (failing_entrypoint, fixed_entrypoint):
        pushed = site.mado(
            "code", "push", ROOT / "examples", "--project", "flow", "--name", "example", "--entrypoint", entrypoint
        )
        assert pushed.exit_code == 0, pushed.output

    launched = site.mado(
        "job",
        "launch",
        "--project",
        "flow",
        "--code-version",
        "example:1",
        "--queue",
        site.queue,
        "--name",
        "first",
        "-q",
    )
    assert launched.exit_code == 0, launched.output
    first_id = int(launched.output)
    first_log = site.mado("job", "logs", first_id, "--follow", "--interval", "0.3", "--timeout", JOB_TIMEOUT_S)
    assert first_log.exit_code == 3, f"{first_log.output}\n{site.logs()}"  # 3: the Job failed
    assert "failed: --fail-at-step 27: stopping at step 27" in first_log.output

    with closing(site.client()) as client:
        first = client.request("GET", f"jobs/{first_id}/")
        assert (first["status"], first["exit_code"], first["run_status"]) == ("failed", 1, "failed")
        source_run = first["run_id"]
        checkpoints = client.request("GET", f"runs/{source_run}/checkpoints/")["results"]
        assert [(c["step"], c["state"]) for c in checkpoints] == [(20, "complete"), (10, "complete")]

        resumed = site.mado("job", "resume", first_id, "--latest", "--code-version", "example:2", "-q")
        assert resumed.exit_code == 0, resumed.output
        second_id = int(resumed.output)
        second_log = site.mado("job", "logs", second_id, "--follow", "--interval", "0.3", "--timeout", JOB_TIMEOUT_S)
        assert second_log.exit_code == 0, f"{second_log.output}\n{site.logs()}"
        assert f"resuming from checkpoint {checkpoints[0]['id']} at step 20" in second_log.output

        second = client.request("GET", f"jobs/{second_id}/")
        assert (second["status"], second["kind"], second["resumed"]) == ("succeeded", "resume", True)
        assert (second["resumed_from_run_id"], second["source_checkpoint_step"]) == (source_run, 20)
        run = client.request("GET", f"runs/{second['run_id']}/")
        assert (run["status"], run["parent_id"], run["source_checkpoint_id"]) == (
            "finished",
            source_run,
            checkpoints[0]["id"],
        )
        # continues at 20, never 0 (docs/design/resume.md#steps-continue)
        assert metric_steps(client, second["run_id"]) == list(range(20, 40))
        assert metric_steps(client, source_run) == list(range(27))
        # the overlap, steps 20..26, is bit for bit the failed run's (docs/design/resume.md#parity)
        parity = run["parity"]
        assert (parity["verdict"], parity["first_step"], parity["last_step"], parity["compared_steps"]) == (
            "identical",
            20,
            26,
            7,
        )
        assert (parity["compared_keys"], parity["checkpoint_step"], run["resume_ignored_at_step"]) == (
            ["train.accuracy", "train.loss"],
            20,
            None,
        )
        assert second["parity"] == parity
        shown = site.mado("job", "show", second_id)
        assert "  parity: identical over steps 20-26 on train.accuracy, train.loss" in shown.output, shown.output
        # the source is not changed (docs/design/resume.md#lineage)
        assert client.request("GET", f"runs/{source_run}/")["status"] == "failed"
        assert [c["step"] for c in client.request("GET", f"runs/{source_run}/checkpoints/")["results"]] == [20, 10]

    assert reference.wait(timeout=300) == 0, reference.stdout.read().decode()
    assert resumed_weights.read_bytes() == (directory / "offline" / "weights.json").read_bytes()


def test_a_job_that_fails_at_step_27_resumed_from_latest_ends_with_the_uninterrupted_weights(tmp_path):
    with deployment(tmp_path) as site:
        run_the_flow(site, tmp_path)


def test_make_demo_fails_a_job_resumes_it_and_prints_both_run_urls(tmp_path):
    port = free_port()
    env = deployment_env(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--exit-after-run", "--port", str(port)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    base = re.escape(f"http://127.0.0.1:{port}/runs/")
    failed = re.search(rf"^Failed run \(job \d+, stopped at step 27\): {base}(\d+)/$", done.stdout, re.M)
    resumed = re.search(
        rf"^Resumed run \(job \d+, from the checkpoint at step 20, finished\): {base}(\d+)/$", done.stdout, re.M
    )
    assert failed and resumed, done.stdout
    assert "Log in as demo / demo-password" in done.stdout
    with closing(sqlite3.connect(f"file:{tmp_path / 'data' / 'mado.sqlite3'}?mode=ro", uri=True)) as db:
        runs = dict(db.execute("SELECT id, status FROM runs_run").fetchall())
        parent, source_step = db.execute(
            "SELECT r.parent_id, c.step FROM runs_run r JOIN checkpoints_checkpoint c ON c.id = r.source_checkpoint_id "
            "WHERE r.id = ?",
            (int(resumed.group(1)),),
        ).fetchone()
    assert (runs[int(failed.group(1))], runs[int(resumed.group(1))]) == ("failed", "finished")
    assert (parent, source_step) == (int(failed.group(1)), 20)


def test_sigterm_to_the_demo_stops_its_web_server_and_worker(tmp_path):
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--port", str(port)],
        cwd=ROOT,
        env=deployment_env(tmp_path / "data"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in demo.stdout:  # until its first Job is queued: the web server and the worker are up
            lines.append(line)
            if " queued (run " in line:
                break
        children = [
            int(pid)
            for pid in subprocess.run(["pgrep", "-P", str(demo.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert len(children) == 2, "".join(lines)
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
        assert "stopping the web server and the worker" in demo.stdout.read()
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if demo.poll() is None:
            demo.kill()
