"""The Celery app (``celery -A config worker -Q <queue>``); configured from Django settings."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("mado")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["mado", "runs", "sweeps", "checkpoints", "jobs", "worker"])
