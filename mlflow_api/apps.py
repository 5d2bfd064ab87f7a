from django.apps import AppConfig


class MlflowApiConfig(AppConfig):
    """The MLflow tracking and artifact protocol, above ``runs`` and ``checkpoints`` (docs/design/house.md#arrows)."""

    name = "mlflow_api"
    verbose_name = "MLflow API"

    def ready(self) -> None:
        from mlflow_api import receivers

        receivers.connect()
