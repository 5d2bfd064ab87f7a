from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from jobs.services._common import RUN_JOB_TASK
        from jobs.services.lifecycle import job_fail_undelivered, job_waits_for_message
        from mado import outbox

        outbox.register(RUN_JOB_TASK, waiting=job_waits_for_message, give_up=job_fail_undelivered)
