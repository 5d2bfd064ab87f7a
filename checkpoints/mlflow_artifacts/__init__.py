"""MLflow artifact proxy, mounted at ``api/2.0/mlflow-artifacts/`` (docs/design/interfaces.md#mlflow)."""
