"""MLflow-compatible tracking REST API under ``/api/2.0/mlflow/`` (docs/design/interfaces.md#mlflow).

Experiments are mado Projects, runs are mado Runs; see docs/mlflow.md.
"""
