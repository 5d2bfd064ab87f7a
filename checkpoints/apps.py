from django.apps import AppConfig

from mado.periodic import schedule_every_interval


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    verbose_name = "Checkpoints and artifacts"

    def ready(self):
        schedule_every_interval("end-abandoned-checkpoints", "checkpoints.tasks.end_abandoned_checkpoints")
        schedule_every_interval("apply-scheduled-retention", "checkpoints.tasks.apply_scheduled_retention")
        schedule_every_interval("scrub-checkpoints", "checkpoints.tasks.scrub_checkpoints")
        from checkpoints import receivers

        receivers.connect()
