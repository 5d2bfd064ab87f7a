from django.apps import AppConfig

from mado.periodic import schedule_every_interval


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self):
        schedule_every_interval("reap-crashed-runs", "runs.tasks.reap_crashed_runs")
