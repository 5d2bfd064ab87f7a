"""The model registry answers as a real MLflow server does, call for call (docs/api.md#model-registry).

One stock-client script (``registry_script``) runs against a real ``mlflow server`` (SQLite, in its own virtual
environment ``.venv-mlflow-server``, which ``make mlflow-server`` builds with the full ``mlflow`` of the version the
project's ``mlflow-skinny`` has) and against mado; every call's HTTP status and ``error_code`` must agree, except
the calls ``DIFFERENT`` names with the reason docs/api.md gives. Without that environment the test skips on a
developer machine and fails under CI (``.ci/run`` builds it).
"""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from tests.mlflow_client.registry_script import registry_script  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

SERVER_VENV = Path(__file__).resolve().parents[2] / ".venv-mlflow-server"
STARTUP_S = 180

# label → why mado answers otherwise (docs/api.md#model-registry).
DIFFERENT = {
    "transition stage": "mado has aliases, not stages: transition-stage answers 400",
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the CLI and its uvicorn worker), SIGKILL to what is left of it."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.2)  # the group's other members end with their parent


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` starting on a free port: call the value to wait until it answers ``/health`` (no
    fixed sleep) and get its URL. Its whole process group is stopped at teardown."""
    executable = SERVER_VENV / "bin" / "mlflow"
    if not executable.exists():
        reason = f"no MLflow server: {executable} is absent (make mlflow-server builds it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must provide it (.ci/run builds it)")
        pytest.skip(reason)
    if not list(SERVER_VENV.glob(f"lib/python*/site-packages/mlflow-{mlflow.__version__}.dist-info")):
        pytest.fail(f"{SERVER_VENV} holds another mlflow than the client's {mlflow.__version__}: make mlflow-server")
    url = f"http://127.0.0.1:{_free_port()}"
    log_path = tmp_path / "mlflow-server.log"
    command = [str(executable), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    command += ["--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1"]
    command += ["--port", url.rsplit(":", 1)[1], "--workers", "1"]
    # No job runner (MLflow's background jobs and their consumers): the registry does not need it, and it costs
    # seconds of CPU at start.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def ready() -> str:
        deadline = time.monotonic() + STARTUP_S
        while not _healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                text = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(f"mlflow server did not answer /health (exit {server.poll()}):\n{text}")
            time.sleep(0.2)
        return url

    try:
        yield ready
    finally:
        _stop(server)


def test_the_registry_answers_each_call_as_an_mlflow_server_does(mlflow_server, mlflow_env):
    # mado first, while the MLflow server is still starting.
    ours = registry_script(mlflow.MlflowClient(tracking_uri=mlflow_env, registry_uri=mlflow_env))
    url = mlflow_server()
    theirs = registry_script(mlflow.MlflowClient(tracking_uri=url, registry_uri=url))

    assert [label for label, *_ in ours] == [label for label, *_ in theirs]
    assert len(theirs) > 90
    differ = [
        f"{label}: MLflow {their[1:]}, mado {our[1:]}"
        for their, our in zip(theirs, ours, strict=True)
        for label in [their[0]]
        if their[1:] != our[1:] and label not in DIFFERENT
    ]
    assert not differ, "\n".join(differ)
    answers = {"MLflow": dict((x[0], x[1:]) for x in theirs), "mado": dict((x[0], x[1:]) for x in ours)}
    for label in DIFFERENT:  # each exception still is one (else it leaves this list)
        assert answers["MLflow"][label] != answers["mado"][label], label
