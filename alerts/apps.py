from django.apps import AppConfig

from mado.periodic import schedule_every_interval


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self):
        schedule_every_interval("alerts-retry-deliveries", "alerts.tasks.retry_deliveries")
        schedule_every_interval("alerts-stalled-metrics", "alerts.tasks.check_stalled_metrics")
        from alerts import receivers

        receivers.connect()
