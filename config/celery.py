"""The Celery app (``celery -A config worker -Q <queue>``); configured from Django settings."""

import os

from celery import Celery
from celery.signals import worker_init, worker_process_init

from mado import broker
from mado.allocator import tune_allocator
from mado.periodic import SCHEDULE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

broker.register()  # filesystem:// writes whole messages only (mado/broker.py)
app = Celery("mado")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["mado", "runs", "sweeps", "checkpoints", "jobs", "alerts", "worker"])


@app.on_after_configure.connect
def _periodic_checks(sender, **kwargs) -> None:
    """Beat's schedule is ``mado.periodic.SCHEDULE`` itself: the apps fill it from their ``ready()``, before beat
    reads it."""
    sender.conf.beat_schedule = SCHEDULE


@worker_init.connect
@worker_process_init.connect
def _tune_allocator(**kwargs) -> None:
    """A worker streams a resumed Job's checkpoint in 1 MiB chunks through several threads, as the web process
    streams an upload: the same malloc settings keep those chunks on reused pages (``mado.allocator``)."""
    tune_allocator()


@worker_init.connect
def _stop_reaches_the_job(**kwargs) -> None:
    """A worker's stop reaches its running Job's code (``worker.shutdown``, docs/design/worker.md#stop). Imported
    here, in the main process before the pool forks its children (they share the page it maps), and not with this
    module, which every web process loads too."""
    import worker.shutdown  # noqa: F401
