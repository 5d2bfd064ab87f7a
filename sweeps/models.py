"""Sweeps and their trials (docs/design/sweeps.md#sweeps, #requeue).

A trial is one parameter set of a Sweep, run as one Run under one run id for
its whole life: a preempted trial goes back to the queue and the next agent
resumes the same Run. Every claim is a conditional change of the trial's
``state`` (or, for a new parameter set, an insert under the Sweep's row
lock with ``(sweep, number)`` unique), so two agents never get one trial.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from runs.models import Project, Run, VisibleQuerySet


class SweepMethod(models.TextChoices):
    GRID = "grid", "grid"
    RANDOM = "random", "random"
    BAYES = "bayes", "Bayesian (TPE)"


class MetricGoal(models.TextChoices):
    MINIMIZE = "minimize", "minimize"
    MAXIMIZE = "maximize", "maximize"


class Sweep(models.Model):
    """A search over ``parameters`` that runs ``program`` once per trial and optimises ``metric_name``.

    ``parameters`` is the normalised parameter space: ``{name: {"values": [...]}
    | {"value": x} | {"min": a, "max": b, "distribution": ...}}``;
    ``program`` the argv (list of str) an agent starts, followed by the
    trial's ``--name=value`` arguments; ``run_cap`` the most trials (None:
    grid size for grid, no limit otherwise); ``config`` the submitted
    configuration as given.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(max_length=200, blank=True)
    method = models.CharField(max_length=10, choices=SweepMethod.choices)
    parameters = models.JSONField()
    metric_name = models.CharField(max_length=250)
    metric_goal = models.CharField(max_length=10, choices=MetricGoal.choices, default=MetricGoal.MINIMIZE)
    program = models.JSONField(help_text="argv list")
    run_cap = models.PositiveIntegerField(null=True, blank=True)
    config = models.JSONField(default=dict, blank=True, help_text="the configuration as submitted")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VisibleQuerySet.as_manager()

    class Meta:
        db_table = "runs_sweep"  # the table the model had while it lived in the runs app (sweeps/0001)
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(method__in=SweepMethod.values), name="sweep_method_valid"),
            models.CheckConstraint(condition=Q(metric_goal__in=MetricGoal.values), name="sweep_metric_goal_valid"),
        ]

    def __str__(self):
        return self.name or f"sweep {self.pk}"


class TrialState(models.TextChoices):
    QUEUED = "queued", "queued"  # waiting for an agent: requeued after preemption, or its lease expired
    LEASED = "leased", "leased"  # claimed by an agent; its program has not started the Run yet
    RUNNING = "running", "running"  # the program started (or resumed) the Run
    DONE = "done", "done"  # the Run ended other than preempted


class SweepTrialQuerySet(VisibleQuerySet):
    project_path = "sweep__project"


class SweepTrial(models.Model):
    """One parameter set of a Sweep and the Run that trains it (one run id for the trial's whole life).

    ``number`` is 1-based per Sweep (for grid: the grid point's index + 1).
    ``agent`` names who holds the lease (``host:pid``) and ``claimed_by`` the
    user whose agent it is (a writer of the Run while the claim holds,
    docs/design/runs.md#write-rule), ``lease_expires_at`` when a claimed trial whose program has not
    started returns to the queue (``MMT_SWEEP_LEASE``). ``requeue_count``
    counts preemptions, ``retry_count`` retries of a failed trial (each a
    fresh Run; the earlier ones stay in ``earlier_runs`` as history, docs/design/sweeps.md#requeue).
    """

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField()
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="sweep_trial")
    parameters = models.JSONField()
    state = models.CharField(max_length=10, choices=TrialState.choices, default=TrialState.LEASED)
    requeue_count = models.PositiveIntegerField(default=0)
    retry_count = models.PositiveIntegerField(default=0)
    earlier_runs = models.ManyToManyField(
        Run, blank=True, related_name="retried_sweep_trials", db_table="runs_sweeptrial_earlier_runs"
    )
    agent = models.CharField(max_length=200, blank=True)
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SweepTrialQuerySet.as_manager()

    class Meta:
        db_table = "runs_sweeptrial"
        ordering = ["sweep", "number"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "number"], name="sweeptrial_unique_sweep_number"),
            models.CheckConstraint(condition=Q(state__in=TrialState.values), name="sweeptrial_state_valid"),
        ]
        indexes = [models.Index(fields=["sweep", "state"], name="sweeptrial_sweep_state_idx")]

    def __str__(self):
        return f"{self.sweep} trial {self.number}"

    def is_held_by(self, user) -> bool:
        """True while ``user``'s agent holds this trial (claimed and not yet done or queued again)."""
        return self.claimed_by_id == user.pk and self.state in (TrialState.LEASED, TrialState.RUNNING)
