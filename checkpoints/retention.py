"""What a retention policy keeps and what it would delete (docs/design/checkpoints.md#retention).

``retention_plan`` is the one computation behind the preview and the apply: per Run, each complete checkpoint
that no rule keeps goes, unless a deletion protection (``selectors.checkpoint_delete_refusal``: the keep count,
a resume source, and whatever else protects a checkpoint) holds it. It reads; it changes nothing.

A preview is a plan with an id (``plan_id``): the exact checkpoint ids it deletes and their bytes, signed so that
apply deletes that set and no other (docs/design/checkpoints.md#retention).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import accumulate

from django.core import signing
from django.db.models import Max, Min
from django.utils import timezone

from checkpoints import selectors
from checkpoints.models import Checkpoint, CheckpointState, RetentionPolicy
from mado.errors import ValidationFailed
from runs.models import MetricPoint, Project, Run

PLAN_SALT = "checkpoints.retention.plan"
PLAN_MAX_AGE = timedelta(days=1)


@dataclass(frozen=True)
class Rules:
    """The rules of a policy; a rule that is None (or ``keep_best`` without ``best_metric``) keeps nothing.

    ``keep_last``: the newest N of each Run by step; ``keep_best``: the K of each Run with the lowest
    (``best_mode`` ``min``) or highest (``max``) value of metric ``best_metric`` logged at the checkpoint's step;
    ``keep_every``: steps that are a multiple of k; ``keep_newer_days``: created less than D days ago.
    """

    keep_last: int | None = None
    keep_best: int | None = None
    best_metric: str = ""
    best_mode: str = RetentionPolicy.BestMode.MIN
    keep_every: int | None = None
    keep_newer_days: int | None = None

    @classmethod
    def of(cls, policy: RetentionPolicy) -> "Rules":
        return cls(
            keep_last=policy.keep_last,
            keep_best=policy.keep_best,
            best_metric=policy.best_metric,
            best_mode=policy.best_mode,
            keep_every=policy.keep_every,
            keep_newer_days=policy.keep_newer_days,
        )


@dataclass
class RunPlan:
    """One Run's part of a plan: ``going`` (checkpoints a policy deletes), ``protected`` ([(checkpoint, the
    protection's sentence)] for those no rule keeps but a protection holds), ``bytes`` that go."""

    run: Run
    going: list[Checkpoint] = field(default_factory=list)
    protected: list[tuple[Checkpoint, str]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(checkpoint.stored_bytes for checkpoint in self.going)


def retention_plan(*, project: Project, rules: Rules, run_ids: list[int] | None = None, now: datetime | None = None):
    """``[RunPlan]`` for every Run of ``project`` (or of ``run_ids``) with something going or protected, by Run id.

    Complete checkpoints only: pending and ``error`` ones hold no verified bytes and are the janitor's.
    """
    rows = Checkpoint.objects.filter(run__project=project, state=CheckpointState.COMPLETE)
    if run_ids is not None:
        rows = rows.filter(run_id__in=run_ids)
    sources = selectors.checkpoint_sources(rows)  # a Project's protections in two queries, not two per checkpoint
    by_run: dict[int, list[Checkpoint]] = {}
    for row in selectors.with_keep_flag(rows).select_related("run").order_by("run_id", "-step"):
        by_run.setdefault(row.run_id, []).append(row)
    plans = []
    for checkpoints in by_run.values():
        kept = _kept_by_rules(checkpoints, rules, now or timezone.now())
        protected_ids = {checkpoint.pk for checkpoint in checkpoints if checkpoint.within_keep_count}
        plan = RunPlan(run=checkpoints[0].run)
        for checkpoint in checkpoints:
            if checkpoint.pk in kept:
                continue
            refusal = selectors.checkpoint_delete_refusal(
                checkpoint=checkpoint, kept_ids=protected_ids, sources=sources
            )
            if refusal:
                plan.protected.append((checkpoint, refusal))
            else:
                plan.going.append(checkpoint)
        if plan.going or plan.protected:
            plans.append(plan)
    return plans


def plan_id(*, project: Project, plans: list[RunPlan]) -> str:
    """The id of a plan: a signed token of ``project``'s id, the ids of the checkpoints ``plans`` delete (sorted)
    and their bytes. Signed rather than stored: a preview writes nothing, and an id cannot name another set."""
    going = sorted(checkpoint.pk for plan in plans for checkpoint in plan.going)
    gaps = [pk - before for before, pk in zip([0, *going], going)]  # small, repeating numbers: a short id
    payload = {"project": project.pk, "going": gaps, "bytes": sum(plan.bytes for plan in plans)}
    return signing.dumps(payload, salt=PLAN_SALT, compress=True)


def plan_read(*, project: Project, plan: str) -> set[int]:
    """The checkpoint ids the plan ``plan`` (a ``plan_id`` of ``project``, made less than a day ago) deletes;
    ``ValidationFailed`` naming ``plan`` for a missing, altered, expired or other Project's id."""
    try:
        payload = signing.loads(plan or "", salt=PLAN_SALT, max_age=PLAN_MAX_AGE)
    except signing.SignatureExpired:
        raise ValidationFailed("this preview is more than a day old: preview the policy again", field="plan")
    except signing.BadSignature:
        raise ValidationFailed("apply needs the plan of a preview: preview the policy first", field="plan")
    if payload.get("project") != project.pk:
        raise ValidationFailed("this plan is another project's: preview this project's policy", field="plan")
    return set(accumulate(payload["going"]))


def plan_json(*, project: Project, plans: list[RunPlan]) -> dict:
    """The preview: the plan's id, per Run what goes (id, step, bytes) and what a protection keeps (id, step,
    reason), the bytes and number of checkpoints that go."""
    runs = [
        {
            "run_id": plan.run.pk,
            "name": plan.run.name,
            "bytes": plan.bytes,
            "going": [{"id": c.pk, "step": c.step, "bytes": c.stored_bytes} for c in plan.going],
            "protected": [{"id": c.pk, "step": c.step, "reason": reason} for c, reason in plan.protected],
        }
        for plan in plans
    ]
    return {
        "plan": plan_id(project=project, plans=plans),
        "runs": runs,
        "bytes": sum(r["bytes"] for r in runs),
        "checkpoints": sum(len(r["going"]) for r in runs),
    }


def _kept_by_rules(checkpoints: list[Checkpoint], rules: Rules, now: datetime) -> set[int]:
    """Ids of one Run's complete checkpoints (newest step first) that some rule keeps."""
    kept = {c.pk for c in checkpoints[: rules.keep_last or 0]}
    if rules.keep_every:
        kept |= {c.pk for c in checkpoints if c.step % rules.keep_every == 0}
    if rules.keep_newer_days is not None:
        since = now - timedelta(days=rules.keep_newer_days)
        kept |= {c.pk for c in checkpoints if c.created_at >= since}
    if rules.keep_best and rules.best_metric:
        kept |= _best(checkpoints, rules)
    return kept


def _best(checkpoints: list[Checkpoint], rules: Rules) -> set[int]:
    """The ``keep_best`` checkpoints by the metric's value at their step (its best value when logged twice);
    a checkpoint whose step has no value is not among the best."""
    best = Min("value") if rules.best_mode == RetentionPolicy.BestMode.MIN else Max("value")
    steps = [c.step for c in checkpoints]
    values = dict(
        MetricPoint.objects.filter(run_id=checkpoints[0].run_id, key=rules.best_metric)
        .at_steps(min(steps), max(steps))
        .filter(step__in=steps)
        .exclude(value=None)
        .values("step")
        .annotate(best=best)
        .values_list("step", "best")
    )
    scored = [c for c in checkpoints if c.step in values]
    scored.sort(key=lambda c: values[c.step], reverse=rules.best_mode == RetentionPolicy.BestMode.MAX)
    return {c.pk for c in scored[: rules.keep_best]}
