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
    send_after = models.DateTimeField(null=True, blank=True)

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


class AuditQuerySet(models.QuerySet):
    """Rows are only ever added: ``update`` and ``delete`` raise (docs/api.md#audit; the database refuses them too)."""

    def update(self, **kwargs):
        raise PermissionError("the audit log is append-only")

    def delete(self):
        raise PermissionError("the audit log is append-only")


class ActorKind(models.TextChoices):
    USER = "user", "user"
    SERVICE_ACCOUNT = "service_account", "service account"
    RUN_TOKEN = "run_token", "run token"
    SYSTEM = "system", "system"


class AuditEvent(models.Model):
    """One write that changed who may do what, or ended, resumed, deleted or changed a Run, Job, Checkpoint,
    Artifact, Project, membership or token (docs/api.md#audit). Append-only.

    ``actor_id`` / ``actor_name`` are the user at the time (kept as values, not a
    foreign key: deleting a user changes no record), ``via`` the credential (a
    token's name, a Run token's Run). ``project_id`` is the Project the object
    belongs to (None: none, e.g. a user's token). ``changes`` maps each changed
    field to ``[before, after]``. ``address`` and ``request_id`` come from the request (None / "" outside one).
    """

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_kind = models.CharField(max_length=20, choices=ActorKind.choices)
    actor_id = models.BigIntegerField(null=True, blank=True)
    actor_name = models.CharField(max_length=150, blank=True)
    via = models.CharField(max_length=200, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    project_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    changes = models.JSONField(default=dict, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.object_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("the audit log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("the audit log is append-only")
