from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    verbose_name = "Checkpoints and artifacts"

    def ready(self):
        from checkpoints import receivers

        receivers.connect()
