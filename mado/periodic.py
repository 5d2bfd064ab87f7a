"""Periodic work (Celery beat), registered by the app that owns it from its ``AppConfig.ready()``.

Each app names its own checks (``docs/design/house.md#tasks``) in
``SCHEDULE``; the Celery app (``config.celery``) hands this same dict to
beat as its ``beat_schedule``, which beat reads once Celery's Django fixup
has loaded the apps. Every check runs every ``MADO_REAPER_INTERVAL`` seconds
on the ``MADO_MAINTENANCE_QUEUE`` queue.
"""

from django.conf import settings

# Beat's schedule: {name: {"task", "schedule" (s), "options"}}, filled as the apps load.
SCHEDULE: dict[str, dict] = {}


def schedule_every_interval(name: str, task: str) -> None:
    """Have beat send the task named ``task`` every ``MADO_REAPER_INTERVAL`` s, as the entry ``name``.

    A run that no worker picked up before the next one is due expires
    (the next one supersedes it). Registering ``name`` again replaces it.
    """
    interval = settings.MADO_REAPER_INTERVAL
    SCHEDULE[name] = {
        "task": task,
        "schedule": float(interval),
        "options": {"queue": settings.MADO_MAINTENANCE_QUEUE, "expires": max(interval - 1, 1)},
    }


def beat_schedule() -> dict[str, dict]:
    """A copy of beat's schedule as registered so far."""
    return dict(SCHEDULE)
