"""MLflow artifact proxy, mounted at ``api/2.0/mlflow-artifacts/`` (SPEC F30)."""
