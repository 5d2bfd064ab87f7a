"""MLflow-compatible tracking REST API under ``/api/2.0/mlflow/`` (SPEC F30).

Experiments are mado Projects, runs are mado Runs; see docs/mlflow.md.
"""
