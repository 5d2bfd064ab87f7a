"""``python manage.py demo``: the README's first command (``make demo``) on the embedded default.

Migrates the SQLite database under ``MADO_DATA_DIR``, creates the demo user
and Project, starts the web server (gunicorn) and a real Celery worker
process, then shows the product's core loop with ``examples/training.py``:

1. registers ``examples/`` as two versions of the Code ``example``: one that
   stops with an error at step 27 (``--fail-at-step 27``), one without;
2. launches the first as a Job: it saves checkpoints at steps 10 and 20 and
   fails at step 27;
3. resumes that Job from its latest checkpoint (step 20) on the second
   version, through ``job_resume_from_latest``, the service behind the
   "Resume from latest checkpoint" button;
4. waits for the resumed Job to succeed (its metric steps continue at 20),
   prints both Runs' URLs and the login, and keeps serving until Ctrl-C
   (``--exit-after-run`` stops here), then stops every process it started.

The Jobs' output is echoed while they run. The web server, the worker and
the Job's code all use the same ``MADO_DATA_DIR``; the worker gives the code
``MMT_API_URL`` = this server (``MADO_PUBLIC_URL``).
"""

import io
import os
import secrets
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError, call_command
from django.urls import reverse

from checkpoints.services import code_version_create_with_archive
from jobs.models import Job, JobStatus, Queue, RunLogChunk
from jobs.services import job_launch, job_resume_from_latest
from runs.models import Code, Membership, Project, Role

DEMO_USER = "demo"
DEMO_PASSWORD = "demo-password"
DEMO_PROJECT = "demo"
DEMO_CODE = "example"
CHECKPOINT_EVERY = 10
FAIL_AT_STEP = 27
JOB_TIMEOUT_S = 900.0
EXAMPLES_DIR = Path(settings.BASE_DIR) / "examples"
# The framework examples, registered as Codes of the demo project (not run: a user launches them from the page)
EXAMPLE_CODES = {
    "accelerate-training": ["python", "accelerate_training.py", "--steps", "40", "--checkpoint-every", "10"],
    "hf-trainer": ["python", "hf_trainer.py", "--steps", "40", "--checkpoint-every", "10"],
    "lightning-training": ["python", "lightning_training.py", "--steps", "40", "--checkpoint-every", "10"],
}


def child_env(base_url: str) -> dict[str, str]:
    """The environment of the web server and the worker: ours, the public URL, and this venv's ``python`` first.

    Without a secret key of ours, the demo's server gets a random one for this run (a server without
    one refuses to start, mado/checks.py).
    """
    env = dict(os.environ)
    if not env.get("MADO_SECRET_KEY") and not env.get("MADO_SECRET_KEY_FILE"):
        env["MADO_SECRET_KEY"] = secrets.token_urlsafe(50)
    env["MADO_PUBLIC_URL"] = base_url
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    return env


def start_process(argv: list[str], *, env: dict[str, str], stdout=None) -> subprocess.Popen:
    """Start ``argv`` in the repository in its own process group (Ctrl-C reaches us, and we stop it in order)."""
    return subprocess.Popen(
        argv,
        cwd=settings.BASE_DIR,
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout else None,
        start_new_session=True,
    )


def web_argv(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "config.wsgi:application",
        "--bind",
        f"{host}:{port}",
        "--workers",
        "2",
        "--threads",
        "4",
        "--log-level",
        "warning",
    ]


def worker_argv(queues: list[str], hostname: str = "demo@%h", loglevel: str = "WARNING") -> list[str]:
    """One worker process running one Job at a time (prefork is not needed: the Job's code is a subprocess)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "--queues",
        ",".join(dict.fromkeys(queues)),
        "--concurrency",
        "1",
        "--pool",
        "solo",
        "--hostname",
        hostname,
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        loglevel,
    ]


def wait_for_web(base_url: str, children, timeout: float = 60.0) -> None:
    """Return once ``base_url`` answers; ``CommandError`` when a child exits or ``timeout`` (s) passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(child.poll() is not None for child in children):
            raise CommandError("the web server or the worker exited during start-up")
        try:
            urllib.request.urlopen(f"{base_url}/accounts/login/", timeout=2)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise CommandError(f"the web server did not answer on {base_url} within {timeout:.0f} s")


def stop_processes(children, grace: float = 10.0) -> None:
    """SIGTERM to each main process (gunicorn and celery stop their own workers); SIGKILL after ``grace`` s."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def examples_archive() -> io.BytesIO:
    """``examples/`` as a tar.gz in memory (a few KiB: the example programs, no caches)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(EXAMPLES_DIR.rglob("*")):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                tar.add(path, arcname=path.relative_to(EXAMPLES_DIR).as_posix(), recursive=False)
    buffer.seek(0)
    return buffer


class Command(BaseCommand):
    help = (
        "Run mado locally (SQLite, filesystem storage and broker): a Job fails at step 27, is resumed from its "
        "step-20 checkpoint as a new Run that finishes; keep serving."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--steps",
            type=int,
            default=40,
            help=f"training steps of the example (more than {FAIL_AT_STEP}; default 40)",
        )
        parser.add_argument(
            "--exit-after-run",
            action="store_true",
            help="stop once the resumed Job finished (instead of serving until Ctrl-C)",
        )

    def handle(self, *args, host, port, steps, exit_after_run, **options):
        if steps <= FAIL_AT_STEP:
            raise CommandError(f"--steps must be more than {FAIL_AT_STEP}: the first Job fails at step {FAIL_AT_STEP}")
        call_command("migrate", interactive=False, verbosity=0)
        user, project = self._demo_user_and_project()
        self._register_example_codes(user, project)
        base_url = f"http://{host}:{port}"
        env = child_env(base_url)
        queue = Queue.objects.get_or_create(name=settings.CELERY_TASK_DEFAULT_QUEUE)[0]
        children = []
        # SIGTERM (kill, a supervisor, CI) stops the demo like Ctrl-C: its web server and worker go with it.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            self.stdout.write(f"starting the web server on {base_url} and a worker on queue {queue.name} …")
            children.append(start_process(web_argv(host, port), env=env))
            children.append(start_process(worker_argv([queue.name, settings.MADO_MAINTENANCE_QUEUE]), env=env))
            wait_for_web(base_url, children)
            failed, resumed = self._fail_then_resume(user, project, queue, steps, children)
            self.stdout.write(
                self.style.SUCCESS(
                    f"Failed run (job {failed.pk}, stopped at step {FAIL_AT_STEP}): {self._run_url(base_url, failed)}"
                )
            )
            self.stdout.write(
                self.style.SUCCESS(
                    f"Resumed run (job {resumed.pk}, from the checkpoint at step {resumed.run.source_checkpoint.step}, "
                    f"{resumed.run.status}): {self._run_url(base_url, resumed)}"
                )
            )
            self.stdout.write(f"Log in as {DEMO_USER} / {DEMO_PASSWORD}")
            if exit_after_run:
                return
            self.stdout.write(
                self.style.SUCCESS(f"serving on {base_url}/ (Ctrl-C stops the web server and the worker)")
            )
            while all(child.poll() is None for child in children):
                time.sleep(1)
            raise CommandError("a child process exited; see its output above")
        except KeyboardInterrupt:
            self.stdout.write("stopping the web server and the worker…")
        finally:
            stop_processes(children)

    def _demo_user_and_project(self):
        user, created = get_user_model().objects.get_or_create(username=DEMO_USER)
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        project, _ = Project.objects.get_or_create(slug=DEMO_PROJECT, defaults={"name": "Demo"})
        Membership.objects.get_or_create(user=user, project=project, defaults={"role": Role.ADMIN})
        return user, project

    def _fail_then_resume(self, user, project, queue, steps: int, children) -> tuple[Job, Job]:
        code = Code.objects.get_or_create(project=project, name=DEMO_CODE, defaults={"created_by": user})[0]
        argv = ["python", "training.py", "--steps", str(steps), "--checkpoint-every", str(CHECKPOINT_EVERY)]
        failing = self._push(user, code, [*argv, "--fail-at-step", str(FAIL_AT_STEP)])
        fixed = self._push(user, code, argv)
        self.stdout.write(
            f"registered examples/ as {code.name} v{failing.version} (fails at step {FAIL_AT_STEP}) "
            f"and v{fixed.version}"
        )
        parameters = {"steps": steps, "checkpoint_every": CHECKPOINT_EVERY}
        first = job_launch(
            actor=user,
            code_version=failing,
            queue=queue,
            parameters=parameters,
            dataset_version_ids=[],
            name=f"demo: fails at step {FAIL_AT_STEP}",
        )
        first = self._wait(first, children)
        if first.status != JobStatus.FAILED:
            raise CommandError(
                f"job {first.pk} ended {first.status}, expected failed at step {FAIL_AT_STEP}: {first.error}"
            )
        resumed = job_resume_from_latest(actor=user, job=first, code_version=fixed)
        self.stdout.write(
            f"resuming job {first.pk} from its latest checkpoint (step "
            f"{resumed.run.source_checkpoint.step}) as job {resumed.pk} on {code.name} v{fixed.version}"
        )
        resumed = self._wait(resumed, children)
        if resumed.status != JobStatus.SUCCEEDED:
            raise CommandError(f"the resumed job {resumed.pk} ended {resumed.status}: {resumed.error}")
        return first, resumed

    def _register_example_codes(self, user, project) -> None:
        """Each of ``EXAMPLE_CODES`` as a Code with one version of ``examples/`` (a Code that has one is left as is)."""
        for name, entrypoint in EXAMPLE_CODES.items():
            code = Code.objects.get_or_create(project=project, name=name, defaults={"created_by": user})[0]
            if not code.versions.exists():
                version = self._push(user, code, entrypoint)
                self.stdout.write(f"registered examples/ as {code.name} v{version.version}: {' '.join(entrypoint)}")

    @staticmethod
    def _push(user, code: Code, entrypoint: list[str]):
        return code_version_create_with_archive(
            actor=user, code=code, entrypoint=entrypoint, archive=examples_archive(), archive_name="examples.tar.gz"
        )

    def _wait(self, job: Job, children, timeout: float = JOB_TIMEOUT_S) -> Job:
        """Echo the Job's log while it runs; return it once final. ``CommandError`` on a dead child or timeout."""
        self.stdout.write(f"job {job.pk} queued (run {job.run_id}); its output:")
        deadline, seen = time.monotonic() + timeout, 0
        while True:
            for chunk in RunLogChunk.objects.filter(run_id=job.run_id, seq__gt=seen).order_by("seq"):
                self.stdout.write(f"  [job {job.pk}] " + chunk.text.rstrip("\n").replace("\n", f"\n  [job {job.pk}] "))
                seen = chunk.seq
            job.refresh_from_db()
            if job.is_final and not RunLogChunk.objects.filter(run_id=job.run_id, seq__gt=seen).exists():
                self.stdout.write(f"job {job.pk} {job.status}")
                return Job.objects.select_related("run__source_checkpoint").get(pk=job.pk)
            if any(child.poll() is not None for child in children):
                raise CommandError("the web server or the worker exited; see its output above")
            if time.monotonic() > deadline:
                raise CommandError(f"job {job.pk} is still {job.status} after {timeout:.0f} s")
            time.sleep(0.5)

    @staticmethod
    def _run_url(base_url: str, job: Job) -> str:
        return base_url + reverse("runs:run-detail", args=[job.run_id])
