"""MLflow-compatible tracking REST API under ``/api/2.0/mlflow/`` (SPEC F30, issue 7 parts 1, 3, 5).

Experiments are mado Projects, runs are mado Runs; see docs/mlflow.md.
"""
