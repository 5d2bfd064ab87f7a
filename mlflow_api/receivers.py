"""What the MLflow protocol does when runs tells of a Run's end (``runs.hooks.run_ended``), and the error shape
of its paths during an outage (``mado.outages``)."""

from mado import outages
from mlflow_api.artifacts.checkpoint_files import checkpoint_files_complete_for_run
from mlflow_api.errors import error_body
from runs import hooks

PREFIXES = ("/api/2.0/mlflow", "/api/3.0/mlflow", "/mlflow/api/")


def complete_files_of_ended_run(sender, *, run, **kwargs) -> None:
    """A Run ended: files logged under ``checkpoints/step-N/`` through the MLflow API become usable
    (docs/design/checkpoints.md#mlflow-checkpoints)."""
    checkpoint_files_complete_for_run(run_id=run.pk)


def outage_body(code: str, mlflow_code: str, detail: str) -> dict:
    """MLflow's ``{"error_code", "message"}`` for an outage answered on an MLflow path."""
    return error_body(mlflow_code, detail)


def connect() -> None:
    """Connect the receiver above to ``runs.hooks`` and register MLflow's outage answer; from ``MlflowApiConfig``."""
    hooks.run_ended.connect(complete_files_of_ended_run, dispatch_uid="mlflow_api.complete_files_of_ended_run")
    outages.register_error_shape(PREFIXES, outage_body)
