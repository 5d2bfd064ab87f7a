from django.apps import AppConfig

from mado.periodic import schedule_every_interval


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        schedule_every_interval("reap-stale-jobs", "jobs.tasks.reap_stale_jobs")
        from jobs import receivers

        receivers.connect()
