from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    verbose_name = "Checkpoints and artifacts"

    def ready(self):
        from checkpoints.services.direct import VERIFY_TASK
        from checkpoints.services.janitor import verification_give_up, verification_waits
        from mado import outbox

        outbox.register(VERIFY_TASK, waiting=verification_waits, give_up=verification_give_up)
