"""Resume anywhere end to end (docs/design/resume.md#resume-anywhere, #steps-continue): gunicorn and a worker on
a migrated SQLite file (``tests/deployment.py``), and ``examples/training.py`` run as plain processes.

The example, started with ``MMT_RUN_ID`` only, saves checkpoints 10 and 20 and fails at step 27. Started again
from a new, empty directory with the same ``MMT_RUN_ID`` and ``MMT_RESUME=must`` and nothing else, it gets
checkpoint 20 from ``run.resume_checkpoint()`` (downloaded, verified, extracted into that directory's cache),
finishes with the weights of an uninterrupted offline run, byte for byte, and the Run holds one curve of steps
0-39. With the stored tar's bytes corrupted on the server, the restarted process stops before training with the
``Checkpoint <id> … mismatch`` error and nothing is cached. ``examples/slurm/train.sbatch``, run as SLURM would
(``srun`` and ``scontrol`` stand-ins), saves on the time-limit signal, requeues itself and resumes on another node
(docs/integrations.md, "SLURM").
"""

import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from tests.deployment import ROOT, Deployment, deployment
from tests.jobs.test_job_flow import EXAMPLE_ARGS, example_offline, metric_steps


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with deployment(tmp_path_factory.mktemp("anywhere")) as found:
        yield found


def example(site: Deployment, cwd: Path, run_id: str, *args: str, resume: str | None = None, **env: str):
    """``examples/training.py`` in ``cwd`` (made empty), on ``site`` as run ``run_id``; the finished process."""
    cwd.mkdir(parents=True)
    variables = {k: v for k, v in os.environ.items() if not k.startswith("MMT_")}
    variables.update(MMT_API_URL=site.url, MMT_API_TOKEN=site.token, MMT_PROJECT="flow", MMT_RUN_ID=run_id, **env)
    if resume:
        variables["MMT_RESUME"] = resume
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "training.py"), *EXAMPLE_ARGS, *args],
        cwd=cwd,
        env=variables,
        capture_output=True,
        text=True,
        timeout=300,
    )


def failed_at_27(site: Deployment, directory: Path, run_id: str) -> tuple[int, list[dict]]:
    """The first start of ``run_id``: fails at step 27; returns its Run id and checkpoints (newest first)."""
    first = example(site, directory / "first", run_id, "--fail-at-step", "27")
    assert first.returncode == 1, first.stdout + first.stderr
    with closing(site.client()) as client:
        run = client.request("GET", "runs/", params={"project": "flow", "external_id": run_id})["results"][0]
        checkpoints = client.request("GET", f"runs/{run['id']}/checkpoints/")["results"]
    assert (run["status"], [(c["step"], c["state"]) for c in checkpoints]) == (
        "failed",
        [(20, "complete"), (10, "complete")],
    )
    return run["id"], checkpoints


def run_anywhere_flow(site: Deployment, directory: Path) -> None:
    """The single-process scenario of the module docstring against ``site``; asserts every step."""
    reference = example_offline(directory / "offline" / "weights.json")
    run_id, checkpoints = failed_at_27(site, directory, "anywhere-1")
    weights = directory / "elsewhere" / "weights.json"
    resumed = example(site, directory / "elsewhere", "anywhere-1", "--output", str(weights), resume="must")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming from checkpoint {checkpoints[0]['id']} at step 20" in resumed.stdout
    assert "without having called run.resume_checkpoint()" not in resumed.stderr
    assert "dropped by the server" not in resumed.stderr  # steps 20-26 replayed, not sent again
    cached = list((directory / "elsewhere" / ".mado" / "cache" / "checkpoints").glob("*/*/checkpoint/model.pt"))
    assert [path.parent.parent.name for path in cached] == [str(checkpoints[0]["id"])]
    with closing(site.client()) as client:
        run = client.request("GET", f"runs/{run_id}/")
        assert (run["status"], run["resume_count"]) == ("finished", 1)
        assert metric_steps(client, run_id) == list(range(40))  # one curve
        # steps 20-26 logged again, compared with the first ones (docs/design/resume.md#same-run-parity)
        (segment,) = run["resume_segments"]
        assert (segment["verdict"], segment["first_step"], segment["last_step"]) == ("identical", 20, 26), segment
        assert (segment["floor"], segment["checkpoint_step"]) == (27, 20)
        assert set(segment["restore_report"]["parts"].values()) == {"restored"}, segment["restore_report"]
        saved = client.request("GET", f"runs/{run_id}/checkpoints/")["results"]
        assert [c["step"] for c in saved] == [40, 30, 20, 10]
    assert reference.wait(timeout=300) == 0, reference.stdout.read().decode()
    assert weights.read_bytes() == (directory / "offline" / "weights.json").read_bytes()


def test_a_run_restarted_by_id_in_an_empty_directory_resumes_from_its_latest_checkpoint(site, tmp_path):
    run_anywhere_flow(site, tmp_path)


def test_a_tampered_stored_checkpoint_stops_the_restarted_process_before_it_trains(site, tmp_path):
    run_id, checkpoints = failed_at_27(site, tmp_path, "anywhere-tampered")
    with closing(sqlite3.connect(f"file:{site.data_dir / 'mado.sqlite3'}?mode=ro", uri=True)) as db:
        (key,) = db.execute(
            "SELECT a.storage_key FROM checkpoints_checkpoint c JOIN checkpoints_artifact a ON a.id = c.artifact_id "
            "WHERE c.id = ?",
            (checkpoints[0]["id"],),
        ).fetchone()
    stored = site.data_dir / "artifacts" / key
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the bytes say so
    stored.chmod(0o644)
    stored.write_bytes(bytes(data))

    weights = tmp_path / "elsewhere" / "weights.json"
    resumed = example(site, tmp_path / "elsewhere", "anywhere-tampered", "--output", str(weights), resume="must")
    assert resumed.returncode != 0
    # the server reads the rewritten tar back before sending a byte and names it (docs/design/checkpoints.md#damage)
    assert f"checkpoint {checkpoints[0]['id']} is corrupt: the tar: the stored object's SHA-256 is" in resumed.stderr
    assert "resuming from checkpoint" not in resumed.stdout and not weights.exists()
    assert not list((tmp_path / "elsewhere" / ".mado" / "cache" / "checkpoints").glob("*/*/checkpoint"))
    with closing(site.client()) as client:
        assert metric_steps(client, run_id) == list(range(27))  # not a step trained
        assert client.request("GET", f"runs/{run_id}/")["status"] == "failed"


def slurm_start(site: Deployment, node: Path, job_id: str, bin_dir: Path, *, signal_after_start=None):
    """One start of ``examples/slurm/train.sbatch`` as SLURM would run it on ``node`` (a new, empty directory
    whose ``examples`` is the repository's): ``srun`` runs its command, ``scontrol`` records its arguments.
    ``signal_after_start``: a signal sent to the training process once it printed its Run's URL."""
    node.mkdir(parents=True)
    (node / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMT_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        MMT_API_URL=site.url,
        MMT_API_TOKEN=site.token,
        MMT_PROJECT="flow",
        SLURM_JOB_ID=job_id,
        SLURM_TMPDIR=str(node / "local-disk"),
        TRAINING_ARGS="--steps 3000 --checkpoint-every 1000",
    )
    script = subprocess.Popen(
        ["bash", str(ROOT / "examples" / "slurm" / "train.sbatch")],
        cwd=node,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in script.stdout:
        lines.append(line)
        if signal_after_start and line.startswith("run ") and "/runs/" in line:
            children = subprocess.run(["pgrep", "-P", str(script.pid)], capture_output=True, text=True).stdout.split()
            os.kill(int(children[0]), signal_after_start)
    return script.wait(timeout=300), "".join(lines)


def test_the_slurm_script_saves_before_the_time_limit_requeues_and_resumes_on_another_node(site, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nexec "$@"\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    for program in bin_dir.iterdir():
        program.chmod(0o755)

    status, output = slurm_start(site, tmp_path / "node1", "4242", bin_dir, signal_after_start=signal.SIGUSR1)
    assert status == 128 + signal.SIGUSR1, output
    assert "stop signal SIGUSR1: saved step" in output and "requeueing job 4242" in output
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    with closing(site.client()) as client:
        run = client.request("GET", "runs/", params={"project": "flow", "external_id": "slurm-4242"})["results"][0]
        saved = client.request("GET", f"runs/{run['id']}/checkpoints/")["results"][0]
    assert run["status"] == "preempted"
    assert saved["metadata"]["preemption"]["signal"] == "SIGUSR1" and saved["signal_to_complete_s"] >= 0

    status, output = slurm_start(site, tmp_path / "node2", "4242", bin_dir)
    assert status == 0, output
    assert f"resuming from checkpoint {saved['id']} at step {saved['step']}" in output
    with closing(site.client()) as client:
        assert client.request("GET", f"runs/{run['id']}/")["status"] == "finished"
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"  # a finished job is not requeued
    assert list((tmp_path / "node2" / "local-disk" / "mado-cache" / "checkpoints").iterdir())
