"""Alert rules, channels, firings and deliveries (docs/design/alerts.md).

A ``Rule`` watches one condition of a Project's Runs (a run event, a metric
condition or an alert sent by the Run's code); a Project rule (``owner``
null) is managed by the Project's admins and sends to its ``channels``, a
personal subscription (``owner`` set) by its member and mails that member.
A ``Firing`` is one (rule, run, condition): unique, so a rule fires once per
Run and condition; a Run's end is one condition per segment (the Run's
``resume_count``), so a Run resumed by id that crashes again fires again.
A ``Failure`` is one lost segment of a Run, kept when a resume by id makes
the Run run again (the lost-work ledger). A ``Delivery`` is one firing sent to one channel,
retried until it is delivered or its attempts run out; its ``idempotency_id``
travels with every attempt so a receiver can drop a repeat.
"""

import uuid

from django.conf import settings
from django.db import models

from runs.models import Project, Run


class Event(models.TextChoices):
    CRASHED = "crashed", "run crashed"
    FAILED = "failed", "run failed"
    PREEMPTED = "preempted", "run preempted"
    FINISHED = "finished", "run finished"
    RESUMED = "resumed", "run resumed"
    CHECKPOINT_REFUSED = "checkpoint_refused", "checkpoint refused or left pending"
    CHECKPOINT_CORRUPT = "checkpoint_corrupt", "stored checkpoint found corrupt"
    JOB_GIVEN_UP = "job_given_up", "Job given up"
    PARITY_DIVERGED = "parity_diverged", "parity diverged"
    METRIC_NONFINITE = "metric_nonfinite", "metric not finite"
    METRIC_ABOVE = "metric_above", "metric above threshold"
    METRIC_BELOW = "metric_below", "metric below threshold"
    METRIC_STALLED = "metric_stalled", "no new point of a metric"
    RUN_ALERT = "run_alert", "alert sent by the run"


RUN_EVENTS = frozenset({Event.CRASHED, Event.FAILED, Event.PREEMPTED, Event.FINISHED})
METRIC_EVENTS = frozenset({Event.METRIC_NONFINITE, Event.METRIC_ABOVE, Event.METRIC_BELOW, Event.METRIC_STALLED})


class ChannelKind(models.TextChoices):
    EMAIL = "email", "email"
    WEBHOOK = "webhook", "webhook (signed JSON)"
    SLACK = "slack", "Slack"
    TEAMS = "teams", "Microsoft Teams"
    DISCORD = "discord", "Discord"


class Channel(models.Model):
    """Where a Project's alerts go: email addresses or a URL (webhook and chat kinds)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=ChannelKind.choices)
    target = models.CharField(max_length=2000, help_text="comma-separated email addresses, or the URL")
    secret = models.CharField(max_length=100, blank=True, help_text="HMAC key of a webhook; shown once")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    last_status = models.CharField(max_length=10, blank=True, help_text="sent or failed: the last delivery's end")
    last_error = models.TextField(blank=True)
    last_delivery_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="alert_channel_unique_name")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name} ({self.kind})"

    @property
    def is_failing(self) -> bool:
        return self.last_status == "failed"


class Rule(models.Model):
    """One watched condition, its filters and where it sends (``Event``; docs/design/alerts.md#rules)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_rules")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="alert_subscriptions",
        help_text="set: a member's personal subscription (mailed to them); null: a Project rule",
    )
    name = models.CharField(max_length=100)
    event = models.CharField(max_length=20, choices=Event.choices)
    key = models.CharField(max_length=200, blank=True, help_text="the metric key of a metric condition")
    threshold = models.FloatField(null=True, blank=True)
    consecutive = models.PositiveIntegerField(default=1, help_text="points in a row beyond the threshold")
    stalled_minutes = models.FloatField(null=True, blank=True, help_text="minutes without a new point")
    kinds = models.JSONField(default=list, blank=True, help_text="Run kinds it watches; empty: all")
    tags = models.JSONField(default=list, blank=True, help_text="Run tag keys (key or key=value); empty: all")
    queues = models.JSONField(default=list, blank=True, help_text="Job queue names; empty: all")
    creators = models.JSONField(default=list, blank=True, help_text="usernames of Run creators; empty: all")
    quiet_minutes = models.FloatField(default=0, help_text="after a firing, others of this rule are only logged")
    channels = models.ManyToManyField(Channel, blank=True, related_name="rules")
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["project", "event"], name="alert_rule_project_event")]

    def __str__(self) -> str:
        return f"{self.name} ({self.event})"


class Firing(models.Model):
    """A rule that fired for a Run and condition, once (``quieted``: inside the rule's quiet period, not sent)."""

    rule = models.ForeignKey(Rule, on_delete=models.CASCADE, related_name="firings")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="alert_firings")
    condition = models.CharField(max_length=300)
    title = models.CharField(max_length=300)
    text = models.TextField(blank=True)
    level = models.CharField(max_length=10, default="warn")
    quieted = models.BooleanField(default=False)
    fired_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rule", "run", "condition"], name="alert_firing_once_per_condition")
        ]

    def __str__(self) -> str:
        return f"{self.rule_id}: {self.condition}"


class Failure(models.Model):
    """One segment of a Run that ended ``crashed``, ``preempted`` or ``failed`` (docs/design/alerts.md#reliability).

    A segment is the Run between two starts: ``segment`` is the Run's ``resume_count`` when it ended. The row outlives
    a same-run resume (which sets the Run running again), and ``resumed_at`` links it to the segment that resumed it.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="failures")
    segment = models.PositiveIntegerField(help_text="the Run's resume_count when this segment ended")
    status = models.CharField(max_length=20)
    started_at = models.DateTimeField(null=True, blank=True, help_text="this segment's start")
    ended_at = models.DateTimeField(help_text="when the server ended it (the reaper's pass, a Job's end, the SDK)")
    last_alive_at = models.DateTimeField(help_text="its last heartbeat or write, whichever is later (else ended_at)")
    reason = models.CharField(max_length=500, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True, help_text="when a resume by id started the next segment")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "segment"], name="alert_failure_once_per_segment")]

    def __str__(self) -> str:
        return f"run {self.run_id} segment {self.segment} {self.status}"


class MetricWatch(models.Model):
    """What a threshold rule remembers of a Run between batches: ``in_a_row`` points beyond the threshold ended a
    batch at ``last_step`` (written only by a batch with such points; docs/design/alerts.md#metric-rules)."""

    rule = models.ForeignKey(Rule, on_delete=models.CASCADE, related_name="watches")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    in_a_row = models.PositiveIntegerField(default=0)
    last_step = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rule", "run"], name="alert_watch_unique")]

    def __str__(self) -> str:
        return f"rule {self.rule_id} run {self.run_id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RETRYING = "retrying", "retrying"
    SENT = "sent", "sent"
    FAILED = "failed", "failed"


class Delivery(models.Model):
    """One firing sent to one channel (or a personal subscription's member: ``email``); the delivery log."""

    firing = models.ForeignKey(Firing, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries")
    email = models.EmailField(blank=True, help_text="a personal subscription's address")
    idempotency_id = models.UUIDField(default=uuid.uuid4, unique=True)
    payload = models.JSONField(help_text="the versioned event body")
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    response_status = models.IntegerField(null=True, blank=True, help_text="HTTP status of the last attempt")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="alert_delivery_due")]

    def __str__(self) -> str:
        return f"delivery {self.idempotency_id} ({self.status})"
