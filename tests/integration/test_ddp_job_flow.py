"""Distributed Jobs end to end on CPU (gloo) (docs/design/worker.md; docs/design/resume.md): gunicorn, a real Celery
worker on Redis, PostgreSQL, and ``examples/ddp_training.py`` started by the worker under torchrun.

A Job with ``nproc_per_node=2`` fails at step 27 after two sharded checkpoints (steps 10 and 20, each one
Checkpoint with a shard per rank and ``world_size`` 2). Resumed from the latest with 2 processes it ends with
weights byte-identical to an uninterrupted 2-process Job; resumed again with 1 process it loads the resharded
state and finishes. Every attempt is one Run whose metric steps continue at 20, with the failed Run as parent, and
gets a parity verdict: identical on 2 processes, within the tolerance (or identical) on 1, where the logged loss of
the global batch is summed in another order.
"""

import json
import shlex
from contextlib import closing

import pytest

from tests.deployment import ROOT, deployment
from tests.jobs.test_job_flow import metric_steps

STEPS = 30
ARGS = ["--steps", str(STEPS), "--checkpoint-every", "10", "--batch-size", "32"]
TIMEOUT_S = "300"


def push(site, number: int, *extra: str) -> str:
    entrypoint = shlex.join(["python", "ddp_training.py", *ARGS, *extra])
    pushed = site.mado(
        "code", "push", ROOT / "examples", "--project", "flow", "--name", "ddp", "--entrypoint", entrypoint
    )
    assert pushed.exit_code == 0, pushed.output
    return f"ddp:{number}"


def follow(site, job_id: int, expected_exit: int) -> str:
    log = site.mado("job", "logs", job_id, "--follow", "--interval", "0.3", "--timeout", TIMEOUT_S)
    assert log.exit_code == expected_exit, f"{log.output}\n{site.logs()}"
    return log.output


def job_id_of(result) -> int:
    assert result.exit_code == 0, result.output
    return int(result.output)


@pytest.mark.slow
def test_a_two_process_job_fails_resumes_on_two_then_one_process_from_sharded_checkpoints(
    postgres_url,
    redis_url,
    tmp_path,
):
    weights = {name: tmp_path / f"{name}.json" for name in ("reference", "resumed-2", "resumed-1")}
    with deployment(tmp_path, MADO_DATABASE_URL=postgres_url, CELERY_BROKER_URL=redis_url) as site:
        failing = push(site, 1, "--fail-at-step", "27")
        reference = push(site, 2, "--output", str(weights["reference"]))
        fixed_2 = push(site, 3, "--output", str(weights["resumed-2"]))
        fixed_1 = push(site, 4, "--output", str(weights["resumed-1"]))

        first_id = job_id_of(
            site.mado(
                "job",
                "launch",
                "--project",
                "flow",
                "--code-version",
                failing,
                "--queue",
                site.queue,
                "--nproc-per-node",
                "2",
                "--name",
                "ddp",
                "-q",
            )
        )
        log = follow(site, first_id, 3)
        assert "rank 0 failed: --fail-at-step 27" in log and "rank 1 failed: --fail-at-step 27" in log
        with closing(site.client()) as client:
            first = client.request("GET", f"jobs/{first_id}/")
            assert (first["status"], first["nproc_per_node"], first["run_status"]) == ("failed", 2, "failed")
            assert first["error"].startswith("torchrun (2 processes) exited with code 1: rank ")
            assert "exited with code 1 (first failure)" in first["error"]
            source_run = first["run_id"]
            checkpoints = client.request("GET", f"runs/{source_run}/checkpoints/")["results"]
            assert [(c["step"], c["state"], c["framework"], c["world_size"]) for c in checkpoints] == [
                (20, "complete", "torch-dcp", 2),
                (10, "complete", "torch-dcp", 2),
            ]
            files = {e["path"] for e in client.request("GET", f"checkpoints/{checkpoints[0]['id']}/")["manifest"]}
            assert {".metadata", "__0_0.distcp", "__1_0.distcp", "mado-checkpoint.json"} <= files
            assert metric_steps(client, source_run) == list(range(27))  # one Run for both ranks
            assert metric_steps(client, source_run, "rank1/train.loss") == list(range(27))

            reference_id = job_id_of(
                site.mado(
                    "job",
                    "launch",
                    "--project",
                    "flow",
                    "--code-version",
                    reference,
                    "--queue",
                    site.queue,
                    "--nproc-per-node",
                    "2",
                    "-q",
                )
            )
            follow(site, reference_id, 0)

            resumed_ids = []
            for version, nproc in ((fixed_2, "2"), (fixed_1, "1")):
                resumed_id = job_id_of(
                    site.mado(
                        "job",
                        "resume",
                        first_id,
                        "--latest",
                        "--code-version",
                        version,
                        "--nproc-per-node",
                        nproc,
                        "-q",
                    )
                )
                log = follow(site, resumed_id, 0)
                assert f"resuming from checkpoint {checkpoints[0]['id']} at step 20 on {nproc} process(es)" in log
                resumed_ids.append(resumed_id)
                job = client.request("GET", f"jobs/{resumed_id}/")
                assert (job["status"], job["kind"], job["nproc_per_node"]) == ("succeeded", "resume", int(nproc))
                run = client.request("GET", f"runs/{job['run_id']}/")
                assert (run["status"], run["parent_id"], run["source_checkpoint_id"]) == (
                    "finished",
                    source_run,
                    checkpoints[0]["id"],
                )
                # continues at 20 (docs/design/resume.md#steps-continue)
                assert metric_steps(client, job["run_id"]) == list(range(20, STEPS))
                saved = client.request("GET", f"runs/{job['run_id']}/checkpoints/")["results"]
                assert [(c["step"], c["world_size"]) for c in saved] == [(STEPS, int(nproc))]
                # a verdict over steps 20..26 on either world size (docs/design/resume.md#parity): on the same one,
                # bit for bit; on one process the global batch's loss summed in another order, within the tolerance
                # (a rank's own slice, rank<k>/train.loss, is logged with more than one process only)
                parity = run["parity"]
                assert (parity["first_step"], parity["last_step"], parity["compared_steps"]) == (20, 26, 7), parity
                if nproc == "2":
                    assert parity["verdict"] == "identical", parity
                    assert parity["compared_keys"] == ["rank0/train.loss", "rank1/train.loss", "train.loss"]
                else:
                    assert parity["verdict"] in ("within_tolerance", "identical"), parity
                    assert parity["compared_keys"] == ["train.loss"], parity
            assert len({client.request("GET", f"jobs/{i}/")["run_id"] for i in resumed_ids}) == 2  # a Run each

    assert weights["resumed-2"].read_bytes() == weights["reference"].read_bytes()
    # One process sums the gradients in another order: not bit for bit, but from the restored state (a fresh
    # start would be far off).
    one_process, two = (json.loads(weights[name].read_text()) for name in ("resumed-1", "reference"))
    assert set(one_process) == set(two)
    assert max(abs(a - b) for name in two for a, b in zip(one_process[name], two[name], strict=True)) < 1e-4
