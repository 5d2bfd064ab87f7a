"""``python manage.py demo``: the README's first command (``make demo``) on the embedded default.

Migrates the SQLite database under ``MADO_DATA_DIR``, creates the demo user
and Project, starts the web server (gunicorn) and a real Celery worker
process, runs ``examples/training.py`` once against the server, prints the
Run's URL and keeps serving until Ctrl-C, then stops every process it started.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError, call_command
from rest_framework.authtoken.models import Token

from runs.models import Membership, Project, Role, Run

DEMO_USER = "demo"
DEMO_PASSWORD = "demo-password"
DEMO_PROJECT = "demo"


class Command(BaseCommand):
    help = "Run mado locally (SQLite, filesystem storage and broker), train the example once, keep serving."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--steps", type=int, default=200, help="training steps of the example run")
        parser.add_argument("--exit-after-run", action="store_true", help="stop once the example run finished")

    def handle(self, *args, host, port, steps, exit_after_run, **options):
        call_command("migrate", interactive=False, verbosity=0)
        token = self._demo_user_and_project()
        base_url = f"http://{host}:{port}"
        children = []
        try:
            children.append(self._start("web", [sys.executable, "-m", "gunicorn", "mado.wsgi:application",
                                                 "--bind", f"{host}:{port}", "--workers", "2", "--threads", "4"]))
            children.append(self._start("worker", [sys.executable, "-m", "celery", "-A", "mado", "worker",
                                                    "--queues", settings.CELERY_TASK_DEFAULT_QUEUE,
                                                    "--concurrency", "1", "--loglevel", "INFO"]))
            self._wait_for_web(base_url, children)
            run = self._train(base_url, token, steps)
            self.stdout.write(self.style.SUCCESS(f"Run: {base_url}/runs/{run.pk}/"))
            self.stdout.write(f"Log in as {DEMO_USER} / {DEMO_PASSWORD}")
            if exit_after_run:
                return
            self.stdout.write(self.style.SUCCESS(f"serving on {base_url}/ (Ctrl-C stops the web server and the worker)"))
            while all(child.poll() is None for child in children):
                time.sleep(1)
            raise CommandError("a child process exited; see its output above")
        except KeyboardInterrupt:
            self.stdout.write("stopping…")
        finally:
            self._stop(children)

    def _demo_user_and_project(self) -> str:
        user, created = get_user_model().objects.get_or_create(username=DEMO_USER)
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        project, _ = Project.objects.get_or_create(slug=DEMO_PROJECT, defaults={"name": "Demo"})
        Membership.objects.get_or_create(user=user, project=project, defaults={"role": Role.ADMIN})
        return Token.objects.get_or_create(user=user)[0].key

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        self.stdout.write(f"starting {name}: {' '.join(argv[1:4])} …")
        # Own process group: Ctrl-C in the terminal reaches us, and we stop the children in order.
        return subprocess.Popen(argv, cwd=settings.BASE_DIR, start_new_session=True)

    def _wait_for_web(self, base_url: str, children, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(child.poll() is not None for child in children):
                raise CommandError("the web server or the worker exited during start-up")
            try:
                urllib.request.urlopen(f"{base_url}/accounts/login/", timeout=2)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise CommandError(f"the web server did not answer on {base_url} within {timeout:.0f} s")

    def _train(self, base_url: str, token: str, steps: int) -> Run:
        env = {**os.environ, "MMT_API_URL": base_url, "MMT_API_TOKEN": token, "MMT_PROJECT": DEMO_PROJECT}
        before = Run.objects.filter(project__slug=DEMO_PROJECT).order_by("-pk").values_list("pk", flat=True).first()
        argv = [sys.executable, str(Path(settings.BASE_DIR) / "examples" / "training.py"), "--steps", str(steps),
                "--name", "demo-training"]
        subprocess.run(argv, env=env, cwd=settings.BASE_DIR, check=True)
        run = Run.objects.filter(project__slug=DEMO_PROJECT, pk__gt=before or 0).order_by("-pk").first()
        if run is None:
            raise CommandError("the example program created no Run")
        return run

    def _stop(self, children, grace: float = 10.0) -> None:
        # SIGTERM to each main process only: gunicorn and celery stop their own workers cleanly.
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
