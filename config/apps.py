from django.apps import AppConfig


class ConfigConfig(AppConfig):
    """The roof (docs/design/house.md#layout): connects the operators' metrics to the events they count."""

    name = "config"

    def ready(self) -> None:
        from celery.signals import task_postrun, task_prerun, worker_ready

        from config import metrics
        from runs import hooks

        hooks.metrics_stored.connect(metrics.count_points, dispatch_uid="config.metrics.count_points")
        task_prerun.connect(metrics.task_started, dispatch_uid="config.metrics.task_started")
        task_postrun.connect(metrics.task_ended, dispatch_uid="config.metrics.task_ended")
        worker_ready.connect(metrics.serve_worker_metrics, dispatch_uid="config.metrics.serve_worker_metrics")
