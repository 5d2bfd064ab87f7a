"""mado's image, run as an operator runs it (docs/deploy.md#images): `migrate`, then `web`, two `worker`s (Jobs;
checkpoint verifications and periodic checks) and `beat` containers from ``deploy/build-image.sh``'s images, on
this machine's PostgreSQL and Redis and a moto S3 server (``--network host``, Podman with runc).

Through them, the demo's flow (tests/jobs/test_job_flow.py's ``run_the_flow``): a Job fails at step 27, is resumed
from its step-20 checkpoint as a new Run whose weights equal an uninterrupted run's; the checkpoints were uploaded
to S3 and verified by the verification worker's container, and the resumed Job's worker container verified the
checkpoint it restored. The containers run as a non-root user; a worker container sent SIGTERM mid-Job sends the
Job's code SIGTERM, ends the Job preempted (docs/deploy.md#graceful-shutdown) and exits. ``make test-container``
builds the images and runs it.
"""

import os
import shutil
import subprocess
import time
import tomllib
import uuid
from contextlib import closing
from pathlib import Path

import pytest
import requests

from config.management.commands.demo import wait_for_web
from tests.deployment import SETUP, Deployment, free_port
from tests.integration.conftest import (  # noqa: F401 - fixtures
    moto_endpoint,
    postgres_url,
    redis_url,
    require_service,
)
from tests.integration.test_faults_outages import bucket, s3_variables  # noqa: F401 - fixture
from tests.jobs.test_job_flow import run_the_flow

pytestmark = pytest.mark.container

VERSION = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["version"]
IMAGE = os.environ.get("MADO_IMAGE", f"localhost/mado:{VERSION}")  # deploy/build-image.sh's tag
WORKER_IMAGE = os.environ.get("MADO_WORKER_IMAGE", f"{IMAGE}-worker")
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
SLOW_JOB = "import time\nfor i in range(15):\n    print(f'tick {i}', flush=True)\n    time.sleep(1)\n"


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def container_log(name: str) -> str:
    """What the container wrote, stdout and stderr together."""
    done = podman("logs", name, check=False)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def images():
    require_service(shutil.which("podman") is not None, "podman is not installed (deploy/build-image.sh installs it)")
    for image in (IMAGE, WORKER_IMAGE):
        present = podman("image", "exists", image, check=False).returncode == 0
        require_service(present, f"image {image} is missing: run deploy/build-image.sh")
    return IMAGE, WORKER_IMAGE


class Stack(Deployment):
    """A ``Deployment`` served by containers; ``logs()`` reads theirs."""

    containers: dict[str, str]

    def logs(self) -> str:
        return "\n".join(f"--- {role} ---\n{container_log(name)[-6000:]}" for role, name in self.containers.items())


@pytest.fixture
def stack(images, tmp_path, postgres_url, redis_url, moto_endpoint, bucket):  # noqa: F811
    web_image, worker_image = images
    port, suffix = free_port(), uuid.uuid4().hex[:8]
    queue, verify = f"flow-{suffix}", f"verify-{suffix}"
    url = f"http://127.0.0.1:{port}"
    tmp_path.chmod(0o777)  # the Jobs write their weights here, as the image's user
    variables = {
        **s3_variables(moto_endpoint, bucket[1]),
        "MADO_DATABASE_URL": postgres_url,
        "CELERY_BROKER_URL": redis_url,
        "MADO_SECRET_KEY": "container-test-secret-value",
        "MADO_PUBLIC_URL": url,
        "MADO_BIND": f"127.0.0.1:{port}",
        "MADO_WEB_WORKERS": "1",
        "MADO_CHECKPOINT_VERIFY_QUEUE": verify,
        "MADO_MAINTENANCE_QUEUE": verify,
        "MADO_REAPER_INTERVAL": "5",
        "MADO_WORKER_GPUS": "none",
        "MADO_JOB_KILL_GRACE": "5",
    }
    env_file = tmp_path / "mado.env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in variables.items()))
    base = ["--network", "host", *LIMITS, "--env-file", str(env_file)]
    podman("run", "--rm", *base, web_image, "migrate")
    setup = podman("run", "--rm", *base, web_image, "manage", "shell", "-c", SETUP.format(queue=queue))
    token = setup.stdout.strip().splitlines()[-1]
    roles = {
        "web": [web_image, "web"],
        "worker": ["--volume", f"{tmp_path}:{tmp_path}", worker_image, "worker", "--queues", queue],
        "verify": [worker_image, "worker", "--queues", verify],
        "beat": [web_image, "beat"],
    }
    containers = {role: f"mado-test-{role}-{suffix}" for role in roles}
    found = Stack(url, token, queue, tmp_path / "data", tmp_path / "worker.log", tmp_path / "web.log")
    found.containers = containers
    try:
        for role, argv in roles.items():
            podman("run", "--detach", "--name", containers[role], *base, *argv)
        wait_for_web(url, [], timeout=90)
        yield found
    finally:
        for name in containers.values():
            podman("rm", "--force", "--time", "5", name, check=False)


def test_the_demo_flow_runs_through_the_containers_as_a_non_root_user(stack, tmp_path):
    for name in stack.containers.values():
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
    deadline = time.monotonic() + 60  # the first checks of a new process load the storage's client
    while (ready := requests.get(f"{stack.url}/readyz", timeout=15)).status_code != 200:
        assert time.monotonic() < deadline, ready.text
        time.sleep(1)
    run_the_flow(stack, tmp_path)
    verified = container_log(stack.containers["verify"])
    assert "worker.tasks.checkpoint_verify" in verified and "succeeded" in verified, verified[-3000:]


def job_log(client, job_id: int) -> str:
    return "".join(chunk["text"] for chunk in client.request("GET", f"jobs/{job_id}/logs/")["results"])


def test_a_worker_sent_sigterm_mid_job_stops_the_code_preempts_the_job_then_exits(stack, tmp_path):
    code = tmp_path / "slow"
    code.mkdir()
    (code / "slow.py").write_text(SLOW_JOB)
    pushed = stack.mado("code", "push", code, "--project", "flow", "--name", "slow", "--entrypoint", "python slow.py")
    assert pushed.exit_code == 0, pushed.output
    launched = stack.mado(
        "job", "launch", "--project", "flow", "--code-version", "slow:1", "--queue", stack.queue, "-q"
    )
    assert launched.exit_code == 0, launched.output
    job_id = int(launched.output)
    with closing(stack.client()) as client:
        deadline = time.monotonic() + 120
        while "tick 2" not in job_log(client, job_id):
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.3)
        podman("kill", "--signal", "TERM", stack.containers["worker"])
        exited = podman("wait", stack.containers["worker"], timeout=120)
        job = client.request("GET", f"jobs/{job_id}/")
        log = job_log(client, job_id)
    # The worker sent the code SIGTERM (it has no handler: it ends at once), ended the Job preempted, once; then exited.
    assert exited.stdout.strip() == "0", stack.logs()
    assert (job["status"], job["exit_code"]) == ("preempted", -15), (job, stack.logs())
    assert job["error"].startswith(
        "The worker was stopped (SIGTERM to the worker): the code was sent SIGTERM and was ended by SIGTERM after "
    ), job
    assert log.count("tick 0") == 1 and "tick 14" not in log, log
    assert "Warm shutdown" in container_log(stack.containers["worker"])


def test_the_image_says_its_sub_commands(images):
    wrong = podman("run", "--rm", "--network", "host", *LIMITS, images[0], "nonsense", check=False)
    assert wrong.returncode == 2 and "web, worker --queues Q, beat, migrate, createsuperuser, demo" in wrong.stderr
    no_queue = podman("run", "--rm", "--network", "host", *LIMITS, images[1], "worker", check=False)
    assert no_queue.returncode == 2 and "worker needs --queues" in no_queue.stderr


def test_worker_beat_and_migrate_refuse_to_start_without_the_secret_key_and_name_it(images):
    web_image, worker_image = images
    for image, argv in ((worker_image, ["worker", "--queues", "cpu"]), (web_image, ["beat"]), (web_image, ["migrate"])):
        refused = podman("run", "--rm", "--network", "host", *LIMITS, image, *argv, check=False, timeout=120)
        assert refused.returncode != 0, (argv, refused.stdout, refused.stderr[-3000:])
        assert f"{argv[0]} refuses to start: MADO_SECRET_KEY is not set" in refused.stderr, refused.stderr[-3000:]
