"""Periodic work (Celery beat), registered by the app that owns it from its ``AppConfig.ready()``.

Each app names its own checks (``docs/design/house.md#tasks``): beat reads
the schedule once the apps are loaded (Celery's Django fixup sets Django up
before beat builds its schedule), so a check lives, and is scheduled, in
one app. Every check runs every ``MADO_REAPER_INTERVAL`` seconds on the
``MADO_MAINTENANCE_QUEUE`` queue.
"""

from celery import current_app
from django.conf import settings


def schedule_every_interval(name: str, task: str) -> None:
    """Have beat send the task named ``task`` every ``MADO_REAPER_INTERVAL`` s, as the entry ``name``.

    A run that no worker picked up before the next one is due expires
    (the next one supersedes it). Registering ``name`` again replaces it.
    """
    interval = settings.MADO_REAPER_INTERVAL
    entry = {
        "task": task,
        "schedule": float(interval),
        "options": {"queue": settings.MADO_MAINTENANCE_QUEUE, "expires": max(interval - 1, 1)},
    }
    current_app.conf.beat_schedule = {**current_app.conf.beat_schedule, name: entry}


def beat_schedule() -> dict[str, dict]:
    """Beat's schedule as registered so far: ``{name: {"task", "schedule" (s), "options"}}``."""
    return dict(current_app.conf.beat_schedule)
