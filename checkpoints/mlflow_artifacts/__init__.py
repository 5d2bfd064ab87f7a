"""MLflow artifact proxy, mounted at ``api/2.0/mlflow-artifacts/`` (issue 7 part 2; SPEC F30)."""
