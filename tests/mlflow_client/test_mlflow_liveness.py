"""A script using the stock MLflow client, killed without a word, ends ``crashed`` after the silent timeout
(docs/design/runs.md#liveness)."""

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
from django.utils import timezone

mlflow = pytest.importorskip("mlflow")

from runs.liveness import runs_reap_crashed  # noqa: E402
from runs.models import Run, RunStatus  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = textwrap.dedent("""
    import time
    import mlflow

    mlflow.set_experiment("Killed")
    with mlflow.start_run() as run:
        mlflow.log_metric("loss", 1.0, step=0)
        print(run.info.run_id, flush=True)
        time.sleep(600)
""")


def test_a_sigtermed_mlflow_script_ends_crashed_after_the_silent_timeout(mlflow_env, settings, tmp_path):
    settings.MMT_SILENT_RUN_TIMEOUT = 60
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_env}
    script = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        run_id = script.stdout.readline().strip()
        assert run_id, "the script did not start its run"
    finally:
        script.send_signal(signal.SIGTERM)
        script.wait(timeout=30)
    run = Run.objects.get(external_id=run_id)
    assert run.status == RunStatus.RUNNING and run.heartbeat_at is None  # nobody said it ended
    assert runs_reap_crashed() == 0  # silent for less than the timeout
    assert runs_reap_crashed(now=timezone.now() + timedelta(seconds=61)) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.CRASHED and "silent for more than 60 s" in run.ended_reason
    assert mlflow.tracking.MlflowClient().get_run(run_id).info.status in ("FAILED", "KILLED")
