from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class WorkerConfig(AppConfig):
    name = "worker"
    verbose_name = "Worker"

    def ready(self):
        from worker.container import check_gpus_setting

        try:  # a bad value fails loudly at startup (docs/design/house.md#settings), not on the first Job
            check_gpus_setting(settings.MADO_WORKER_GPUS)
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
