from django.apps import AppConfig


class ParityConfig(AppConfig):
    name = "parity"
    verbose_name = "Resume parity"

    def ready(self):
        from parity import receivers

        receivers.connect()
