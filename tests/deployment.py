"""A real deployment for end-to-end tests: a migrated SQLite file in a fresh ``MADO_DATA_DIR``, gunicorn
and one Celery worker on a queue of its own, user ``flow`` (member of project ``flow``) with an API token.

pytest-django's test database is private to the test process, and Django's test server cannot
read chunked request bodies (the MLflow client sends some); these tests therefore talk to real processes.
"""

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from config.management.commands.demo import start_process, stop_processes, wait_for_web, web_argv, worker_argv
from mado_tracking.cli import main
from mado_tracking.client import ApiClient
from mado_tracking.config import Config

ROOT = Path(__file__).resolve().parents[1]

SETUP = """
from django.contrib.auth import get_user_model
from jobs.models import Queue
from mado.tokens import api_token_create
from runs.models import Membership, Project, Role
user = get_user_model().objects.create_user("flow", password="flow-password")
project = Project.objects.create(name="Flow", slug="flow")
Membership.objects.create(user=user, project=project, role=Role.MEMBER)
Queue.objects.get_or_create(name={queue!r})
print(api_token_create(user=user, name="deployment test", scope="admin", expires_in_days=None)[1])
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deployment_env(data_dir: Path, **variables: str) -> dict[str, str]:
    """Our environment without ``MADO_*``/``CELERY_*``/``MMT_*`` settings, on ``data_dir``, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MADO_", "CELERY_", "DJANGO_", "MMT_"))}
    env.update(
        {
            "MADO_DATA_DIR": str(data_dir),
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "MADO_WORKER_GPUS": "none",
            "MADO_JOB_KILL_GRACE": "5",
            "MADO_SECRET_KEY": "job-flow-test-secret-value",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        }
    )
    env.update(variables)
    return env


@dataclass
class Deployment:
    url: str
    token: str
    queue: str
    data_dir: Path
    worker_log: Path
    web_log: Path

    def client(self) -> ApiClient:
        return ApiClient(Config(api_url=self.url, api_token=self.token))

    def mado(self, *args):
        """The ``mado`` command line against this deployment as user ``flow``."""
        env = {"MMT_API_URL": self.url, "MMT_API_TOKEN": self.token, "MMT_PROJECT": None}
        return CliRunner().invoke(main, [str(arg) for arg in args], env=env, catch_exceptions=False)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name} ---\n{path.read_text(errors='replace')[-6000:]}"
            for path in (self.worker_log, self.web_log)
            if path.exists()
        )


_MIGRATED = {}  # "sqlite": the embedded database this process migrated once, copied into each new data folder


def migrate(env: dict[str, str]) -> None:
    """Migrate the database that ``env`` names, as ``manage.py migrate`` does.

    The embedded SQLite database (no ``MADO_DATABASE_URL``) is migrated once per test process, in a folder of its
    own, and copied to ``MADO_DATA_DIR/mado.sqlite3``: the file migrate writes there, without its 8 CPU-seconds
    per deployment. A PostgreSQL database is migrated in place.
    """
    manage = [sys.executable, "manage.py", "migrate", "--noinput"]
    if env.get("MADO_DATABASE_URL"):
        subprocess.run(manage, cwd=ROOT, env=env, check=True, capture_output=True)
        return
    if "sqlite" not in _MIGRATED:
        folder = Path(tempfile.mkdtemp(prefix="mado-migrated-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        subprocess.run(manage, cwd=ROOT, env={**env, "MADO_DATA_DIR": str(folder)}, check=True, capture_output=True)
        _MIGRATED["sqlite"] = folder / "mado.sqlite3"
    data = Path(env["MADO_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MIGRATED["sqlite"], data / "mado.sqlite3")


@contextmanager
def deployment(directory: Path, **variables: str):
    """Migrate a fresh ``MADO_DATA_DIR``, add user ``flow`` (member of project ``flow``) and a queue of its own,
    start gunicorn and one Celery worker on that queue; yield a ``Deployment``; stop both."""
    port, queue = free_port(), f"flow-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{port}"
    # The one worker also runs checkpoint verifications (direct S3 uploads), unless the test routes them elsewhere.
    env = deployment_env(
        directory / "data", **{"MADO_PUBLIC_URL": url, "MADO_CHECKPOINT_VERIFY_QUEUE": queue, **variables}
    )
    migrate(env)
    setup = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SETUP.format(queue=queue)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    found = Deployment(
        url=url,
        token=setup.stdout.strip().splitlines()[-1],
        queue=queue,
        data_dir=directory / "data",
        worker_log=directory / "worker.log",
        web_log=directory / "web.log",
    )
    children = []
    try:
        with open(found.web_log, "wb") as web_out, open(found.worker_log, "wb") as worker_out:
            children.append(start_process(web_argv("127.0.0.1", port), env=env, stdout=web_out))
            children.append(
                start_process(worker_argv([queue], hostname="flow@%h", loglevel="INFO"), env=env, stdout=worker_out)
            )
        wait_for_web(url, children)
        yield found
    finally:
        stop_processes(children)
