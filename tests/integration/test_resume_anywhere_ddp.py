"""Resume anywhere from a sharded checkpoint (docs/design/resume.md#resume-anywhere; docs/design/worker.md#distributed)
on PostgreSQL: gunicorn and a worker (``tests/deployment.py``), ``examples/ddp_training.py`` run by the test.

Two processes under torchrun, started with ``MMT_RUN_ID=ddp-1`` only, save sharded checkpoints 10 and 20 (one
Checkpoint each, a shard per rank) and fail at step 27. One plain process, started from a new, empty directory
with ``MMT_RUN_ID=ddp-1`` and ``MMT_RESUME=must``, gets checkpoint 20 from ``run.resume_checkpoint()``, loads it
resharded and finishes the same Run: one curve of steps 0-29, checkpoints 30 back to 10, and weights equal to a
two-process run's within float summation order (one process sums each gradient over 32 examples, two sum two
halves; a fresh start would be far off).
"""

import json
import os
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from tests.deployment import ROOT, Deployment, deployment
from tests.jobs.test_job_flow import metric_steps

ARGS = ["--steps", "30", "--checkpoint-every", "10", "--batch-size", "32"]


def ddp_example(site: Deployment, cwd: Path, run_id: str, processes: int, *args: str, **env: str):
    cwd.mkdir(parents=True)
    variables = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    variables.update(MMT_API_URL=site.url, MMT_API_TOKEN=site.token, MMT_PROJECT="flow", MMT_RUN_ID=run_id, **env)
    script = str(ROOT / "examples" / "ddp_training.py")
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    return subprocess.run(
        [*launcher, script, *ARGS, *args], cwd=cwd, env=variables, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_two_process_run_restarted_by_id_on_one_process_resumes_from_its_sharded_checkpoint(
    postgres_url,
    redis_url,
    tmp_path,
):
    with deployment(tmp_path, MADO_DATABASE_URL=postgres_url, CELERY_BROKER_URL=redis_url) as site:
        reference = tmp_path / "reference.json"
        whole = ddp_example(site, tmp_path / "reference", "ddp-reference", 2, "--output", str(reference))
        assert whole.returncode == 0, whole.stdout + whole.stderr

        first = ddp_example(site, tmp_path / "first", "ddp-1", 2, "--fail-at-step", "27")
        assert first.returncode != 0 and "rank 1 failed: --fail-at-step 27" in first.stderr, first.stderr[-3000:]
        with closing(site.client()) as client:
            run = client.request("GET", "runs/", params={"project": "flow", "external_id": "ddp-1"})["results"][0]
            checkpoints = client.request("GET", f"runs/{run['id']}/checkpoints/")["results"]
            assert [(c["step"], c["world_size"]) for c in checkpoints] == [(20, 2), (10, 2)]

        weights = tmp_path / "elsewhere" / "weights.json"
        resumed = ddp_example(site, tmp_path / "elsewhere", "ddp-1", 1, "--output", str(weights), MMT_RESUME="must")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"resuming from checkpoint {checkpoints[0]['id']} at step 20 on 1 process(es)" in resumed.stdout
        assert "dropped by the server" not in resumed.stderr, resumed.stderr
        with closing(site.client()) as client:
            resource = client.request("GET", f"runs/{run['id']}/")
            assert resource["status"] == "finished"
            (segment,) = resource["resume_segments"]  # steps 20-26 again, on one process instead of two
            assert (segment["checkpoint_step"], segment["first_step"]) == (20, 20), segment
            # one process sums the gradients in another order than two: the same values to about 1e-7
            assert segment["verdict"] == "within_tolerance", segment
            report = segment["restore_report"]
            assert report["parts"] == {
                "data_position": "not_declared",
                "global_step": "restored",
                "model": "restored",
                "optimizer": "restored",
            }, report
            assert metric_steps(client, run["id"]) == list(range(30))
            saved = client.request("GET", f"runs/{run['id']}/checkpoints/")["results"]
            assert [(c["step"], c["world_size"]) for c in saved] == [(30, 1), (20, 2), (10, 2)]

    one_process, two = (json.loads(path.read_text()) for path in (weights, reference))
    assert set(one_process) == set(two)
    assert max(abs(a - b) for name in two for a, b in zip(one_process[name], two[name], strict=True)) < 1e-6
