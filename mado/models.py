"""Ground-level rows shared by every app: the dispatch outbox (mado/outbox.py), API tokens (mado/tokens.py)."""

from django.conf import settings
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


class TokenScope(models.TextChoices):
    """What an API token may do (docs/api.md#tokens): ``read`` reads, ``write`` also writes what its user may
    write as a member, ``admin`` also does what only Project admins do (members, deletions, tokens)."""

    READ = "read", "read"
    WRITE = "write", "write"
    ADMIN = "admin", "admin"


class ApiToken(models.Model):
    """A user's named API token (docs/api.md#tokens), stored only as ``prefix`` (to find it) and ``digest``.

    The key itself is shown once, when created (``mado.tokens.api_token_create``).
    ``expires_at`` None never expires (only tokens carried over from before
    expiry existed); ``revoked_at`` set: refused from then on. ``last_used_at``
    and ``last_used_ip`` are refreshed at most once a minute per token.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=10, choices=TokenScope.choices, default=TokenScope.WRITE)
    prefix = models.CharField(max_length=12, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_ip = models.GenericIPAddressField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # a double click on "Create" makes one token, not two of the same name
            models.UniqueConstraint(
                fields=["user", "name"], condition=Q(revoked_at__isnull=True), name="apitoken_active_name_unique"
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"
