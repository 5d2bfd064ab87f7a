"""The fail-at-27 / resume-from-20 Job flow for a training program of the examples, on PostgreSQL, Redis and the
S3-compatible server (docs/integrations.md; docs/design/resume.md#latest-checkpoint, #steps-continue).

``full_site`` starts a deployment (gunicorn and a Celery worker, tests/deployment.py) on a fresh PostgreSQL
database, a Redis broker and moto's S3; ``fail_resume_and_compare`` pushes ``examples/`` as three versions of a
Code (uninterrupted, failing at a step, fixed), runs the uninterrupted Job and the failing one, resumes the
failed one from its latest checkpoint on the fixed version, and returns what a test asserts on.
"""

import shlex
import uuid
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3

from config.management.commands.demo import start_process, stop_processes, worker_argv
from mado_tracking.client import ApiClient
from tests.deployment import ROOT, Deployment, deployment, deployment_env
from tests.integration.conftest import S3_BUCKET

JOB_TIMEOUT_S = "420"


@contextmanager
def full_site(directory: Path, *, postgres_url: str, redis_url: str, moto_endpoint: str):
    """A ``Deployment`` on ``postgres_url`` (a database of its own), the Redis broker and a new moto bucket, with a
    second worker that verifies checkpoints: the site's one worker is busy running the Job whose uploads wait for it.
    """
    bucket = f"{S3_BUCKET}-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    variables = dict(
        MADO_DATABASE_URL=postgres_url,
        CELERY_BROKER_URL=redis_url,
        MADO_STORAGE="s3",
        MADO_S3_BUCKET=bucket,
        MADO_S3_ENDPOINT_URL=moto_endpoint,
        MADO_S3_REGION="us-east-1",
        MADO_S3_ACCESS_KEY_ID="testing",
        MADO_S3_SECRET_ACCESS_KEY="testing",
        MADO_CHECKPOINT_VERIFY_QUEUE=f"verify-{uuid.uuid4().hex[:8]}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    with deployment(directory, **variables) as site:
        env = deployment_env(site.data_dir, MADO_PUBLIC_URL=site.url, **variables)
        argv = worker_argv([variables["MADO_CHECKPOINT_VERIFY_QUEUE"]], hostname="verify@%h", loglevel="INFO")
        with open(directory / "verify-worker.log", "wb") as log:
            verifier = start_process(argv, env=env, stdout=log)
        try:
            yield site
        finally:
            stop_processes([verifier])


@dataclass
class FlowResult:
    """What the flow saw: the three Jobs' API resources, the failed Run's checkpoints (newest first), the
    weights files, and the logs."""

    reference: dict
    failed: dict
    resumed: dict
    checkpoints: list[dict]
    reference_weights: Path
    resumed_weights: Path
    failed_log: str
    resumed_log: str


def wait_job(site: Deployment, job_id: int, expected_exit: int) -> str:
    """Follow Job ``job_id``'s log until it ends; assert ``mado job logs`` exit status (0 succeeded, 3 failed)."""
    log = site.mado("job", "logs", job_id, "--follow", "--interval", "0.5", "--timeout", JOB_TIMEOUT_S)
    assert log.exit_code == expected_exit, f"job {job_id}: {log.output}\n{site.logs()}"
    return log.output


def push(site: Deployment, name: str, argv: list[str]) -> str:
    """Register ``examples/`` as a new version of Code ``name`` running ``argv``; return ``name:<version>``."""
    pushed = site.mado(
        "code", "push", ROOT / "examples", "--project", "flow", "--name", name, "--entrypoint", shlex.join(argv), "-q"
    )
    assert pushed.exit_code == 0, pushed.output
    return pushed.output.strip().splitlines()[-1]


def fail_resume_and_compare(
    site: Deployment, directory: Path, *, script: str, args: list[str], fail_at_step: int = 27
) -> FlowResult:
    """Run ``examples/<script> <args>`` as an uninterrupted Job and as one that fails at ``fail_at_step``, resume the
    failed one from its latest checkpoint (``mado job resume --latest``); return the ``FlowResult``.

    Asserts each Job's outcome; the caller compares what matters for its framework (weights, steps).
    """
    name = Path(script).stem.replace("_", "-")
    reference_weights, resumed_weights = directory / "reference-weights.bin", directory / "resumed-weights.bin"
    base = ["python", script, *args]
    reference_version = push(site, name, [*base, "--output", str(reference_weights)])
    failing_version = push(site, name, [*base, "--fail-at-step", str(fail_at_step)])
    fixed_version = push(site, name, [*base, "--output", str(resumed_weights)])

    ids = {}
    for label, version in (("reference", reference_version), ("failing", failing_version)):
        launched = site.mado(
            "job",
            "launch",
            "--project",
            "flow",
            "--code-version",
            version,
            "--queue",
            site.queue,
            "--name",
            label,
            "-q",
        )
        assert launched.exit_code == 0, launched.output
        ids[label] = int(launched.output)
    wait_job(site, ids["reference"], 0)
    failed_log = wait_job(site, ids["failing"], 3)
    with closing(ApiClient(site.client().config)) as client:
        failed = client.request("GET", f"jobs/{ids['failing']}/")
        checkpoints = client.request("GET", f"runs/{failed['run_id']}/checkpoints/")["results"]
        resumed_id = site.mado("job", "resume", ids["failing"], "--latest", "--code-version", fixed_version, "-q")
        assert resumed_id.exit_code == 0, resumed_id.output
        resumed_log = wait_job(site, int(resumed_id.output), 0)
        return FlowResult(
            reference=client.request("GET", f"jobs/{ids['reference']}/"),
            failed=client.request("GET", f"jobs/{ids['failing']}/"),
            resumed=client.request("GET", f"jobs/{int(resumed_id.output)}/"),
            checkpoints=checkpoints,
            reference_weights=reference_weights,
            resumed_weights=resumed_weights,
            failed_log=failed_log,
            resumed_log=resumed_log,
        )


def assert_restored(flow: FlowResult) -> None:
    """The resumed Job's Run sent a restore report of its source checkpoint (the newest of ``flow.checkpoints``)
    naming every part restored, and is not marked "Resume ignored?" (docs/integrations.md, "What a resume
    restored")."""
    report = flow.resumed["restore_report"]
    assert report is not None, "the integration sent no restore report"
    assert (report["not_restored"], report["unknown"], report["not_declared"]) == ([], [], []), report["details"]
    assert report["checkpoint_id"] == flow.checkpoints[0]["id"]
    assert flow.resumed["resume_ignored_at_step"] is None


def metric_steps(site: Deployment, run_id: int, key: str) -> list[int]:
    """The steps of Run ``run_id``'s points of ``key``, ascending (at most 1,000)."""
    with closing(site.client()) as client:
        page = client.request("GET", f"runs/{run_id}/metrics/", params={"key": key, "page_size": 1000})
    return [point["step"] for point in page["results"]]
