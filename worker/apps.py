from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class WorkerConfig(AppConfig):
    name = "worker"
    verbose_name = "Worker"

    def ready(self):
        from checkpoints import hooks
        from worker.container import check_gpus_setting
        from worker.tasks import enqueue_checkpoint_verify

        hooks.direct_upload_declared.connect(enqueue_checkpoint_verify, dispatch_uid="worker.enqueue_checkpoint_verify")

        try:  # a bad value fails loudly at startup (STYLE: Settings), not on the first Job
            check_gpus_setting(settings.MADO_WORKER_GPUS)
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
