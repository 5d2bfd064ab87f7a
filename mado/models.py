"""Ground-level rows shared by every app: the dispatch outbox (mado/outbox.py)."""

from django.db import models
from django.db.models import Q


class Dispatch(models.Model):
    """A Celery message written in the same transaction as the work it asks for (the outbox).

    ``task`` is the task's registered name (data, so no app imports the
    worker), ``args`` its JSON arguments, ``queue`` the Celery queue and
    ``task_id`` the message's task id. ``sent_at`` is when the broker last
    took the message (None: not yet, e.g. the broker was down), ``sends``
    how many times it took it (1 + re-dispatches), ``last_error`` why the
    last send failed. ``done_at`` is set once nobody waits for the message
    any more (the work was taken, or given up).
    """

    task = models.CharField(max_length=200)
    args = models.JSONField(default=list, blank=True)
    queue = models.CharField(max_length=200)
    task_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    sends = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["created_at"], condition=Q(sent_at__isnull=True), name="dispatch_unsent_idx"),
            models.Index(fields=["sent_at"], condition=Q(done_at__isnull=True), name="dispatch_open_idx"),
        ]

    def __str__(self):
        return f"{self.task}{self.args} → {self.queue}"
