"""The stock MLflow client pointed at a live mado server."""

import os

import pytest

from tests.factories import api_key

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def mlflow_env(monkeypatch, live_server, member):
    """MLflow client variables pointing at the live server as ``member``; no active run leaks between tests."""
    token = api_key(member)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", live_server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    for name in (
        "MLFLOW_EXPERIMENT_NAME",
        "MLFLOW_EXPERIMENT_ID",
        "MLFLOW_RUN_ID",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    ):
        monkeypatch.delenv(name, raising=False)
    mlflow.set_tracking_uri(live_server.url)
    yield live_server.url
    while mlflow.active_run():
        mlflow.end_run()


@pytest.fixture(autouse=True)
def _no_active_experiment():
    """``set_experiment`` leaves the experiment in the client module and in ``os.environ``: forget it after each
    test."""
    yield
    mlflow.tracking.fluent._active_experiment_id = None
    os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
