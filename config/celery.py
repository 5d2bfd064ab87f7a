"""The Celery app (``celery -A config worker -Q <queue>``); configured from Django settings."""

import os

from celery import Celery

from mado.periodic import SCHEDULE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("mado")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["mado", "runs", "sweeps", "checkpoints", "jobs", "alerts", "worker"])


@app.on_after_configure.connect
def _periodic_checks(sender, **kwargs) -> None:
    """Beat's schedule is ``mado.periodic.SCHEDULE`` itself: the apps fill it from their ``ready()``, before beat
    reads it."""
    sender.conf.beat_schedule = SCHEDULE
