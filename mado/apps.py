from django.apps import AppConfig


class MadoConfig(AppConfig):
    name = "mado"
    verbose_name = "mado"

    def ready(self):
        from mado import checks  # noqa: F401 - registers the deploy checks
