"""Retention policies and bulk deletion (docs/design/checkpoints.md#retention, #deletion).

An admin sets a Project's policy, previews it (``checkpoints.retention.retention_plan``: a plan with an id) and
applies that plan; with ``scheduled`` beat plans and applies it once a day as the admin who last saved it. Nothing
is deleted otherwise. Every deletion goes through ``deletion.checkpoints_delete`` and its one protection check.
"""

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from checkpoints.models import Checkpoint, CheckpointDeletion, CheckpointState, RetentionPolicy
from checkpoints.retention import Rules, plan_json, plan_read, retention_plan
from checkpoints.services.deletion import Deleted, checkpoints_delete
from mado import policy
from mado.audit import audit_record
from mado.errors import Conflict, ValidationFailed
from runs.models import Project

logger = logging.getLogger(__name__)
SCHEDULE_EVERY = timedelta(days=1)


def clean_rules(rules: Rules) -> Rules:
    """``rules`` when at least one rule is set and ``keep_best`` names its metric; else ``ValidationFailed``
    naming the field (a policy of no rule would delete every unprotected checkpoint)."""
    if rules.keep_best and not rules.best_metric.strip():
        raise ValidationFailed("keep_best needs best_metric, the metric that ranks checkpoints", field="best_metric")
    if rules.best_mode not in RetentionPolicy.BestMode.values:
        raise ValidationFailed("best_mode must be 'min' or 'max'", field="best_mode")
    if not (rules.keep_last or rules.keep_best or rules.keep_every or rules.keep_newer_days is not None):
        raise ValidationFailed(
            "set at least one rule (keep_last, keep_best, keep_every or keep_newer_days)", field="keep_last"
        )
    return rules


@transaction.atomic
def retention_policy_set(*, actor, project: Project, rules: Rules, scheduled: bool) -> RetentionPolicy:
    """Save ``project``'s policy (``rules`` checked by ``clean_rules``; ``scheduled``: beat applies it daily).

    Project admin only (``Forbidden``). Deletes nothing. Saving twice keeps one row (the Project's one-to-one
    constraint; a concurrent first save retries as an update).
    """
    policy.require_role(actor, project, policy.ADMIN)
    clean_rules(rules)
    values = {**vars(rules), "scheduled": scheduled, "updated_by": actor}
    before = RetentionPolicy.objects.filter(project=project).values(*vars(rules), "scheduled").first()
    try:
        with transaction.atomic():
            row, _ = RetentionPolicy.objects.update_or_create(project=project, defaults=values)
    except IntegrityError:
        row, _ = RetentionPolicy.objects.update_or_create(project=project, defaults=values)
    after = {**vars(rules), "scheduled": scheduled}
    changes = {name: [(before or {}).get(name), value] for name, value in after.items()}
    audit_record(actor=actor, action="retention_policy.set", obj=row, project_id=project.pk, changes=changes)
    return row


def _audit_deleted(*, actor, project: Project, action: str, outcome: Deleted) -> None:
    audit_record(
        actor=actor,
        action=action,
        obj=project,
        project_id=project.pk,
        changes={"deleted_checkpoints": [None, [row.pk for row in outcome.deleted]], "bytes": [None, outcome.bytes]},
    )


class PlanChanged(Conflict):
    """Apply refused because deleting now would delete a checkpoint the plan did not list; ``extra["plan"]`` holds
    the fresh preview (docs/design/checkpoints.md#retention)."""

    code = "plan_changed"


@dataclass
class Applied(Deleted):
    """What applying a plan did: ``Deleted``'s fields, ``refused`` naming every planned checkpoint that stayed, and
    ``skipped`` the same as ``[(checkpoint, reason)]`` for pages (a checkpoint gone since has no row)."""

    skipped: list[tuple[Checkpoint, str]] = field(default_factory=list)


def _saved(project: Project) -> RetentionPolicy:
    """The saved policy, its row locked so an edit waits until this apply commits."""
    saved = RetentionPolicy.objects.select_for_update().filter(project=project).first()
    if saved is None:
        raise ValidationFailed("this project has no retention policy; save one first", field="policy")
    return saved


@transaction.atomic
def retention_apply(*, actor, project: Project, plan: str, cause: str = CheckpointDeletion.Cause.POLICY) -> Applied:
    """Apply the preview ``plan`` (a ``plan_id`` of ``project``) under the saved policy.

    Deletes exactly the plan's checkpoints minus those the saved policy now keeps or a protection holds (each in
    ``refused`` / ``skipped`` with its reason). When the saved policy, the keep count or a Run's checkpoints now
    make the policy delete a checkpoint the plan did not list, deletes nothing: ``PlanChanged`` (409) carrying the
    fresh preview. Applying a plan twice deletes once (the second finds them deleted). Project admin only
    (``Forbidden``); no saved policy or a bad plan → ``ValidationFailed``.
    """
    policy.require_role(actor, project, policy.ADMIN)
    saved = _saved(project)
    planned = plan_read(project=project, plan=plan)
    fresh = retention_plan(project=project, rules=Rules.of(saved))
    return _apply(actor=actor, project=project, saved=saved, planned=planned, fresh=fresh, cause=cause)


def _apply(*, actor, project: Project, saved: RetentionPolicy, planned: set[int], fresh, cause: str) -> Applied:
    """Delete ``planned`` ∩ what ``fresh`` (the saved policy's plan now) lists as going, after refusing when
    ``fresh`` would delete one more; the caller's transaction holds it all."""
    going = {checkpoint.pk for run_plan in fresh for checkpoint in run_plan.going}
    if going - planned:
        fresh_plan = plan_json(project=project, plans=fresh)
        raise PlanChanged(_("the plan changed: review it again"), field="plan", extra={"plan": fresh_plan})
    outcome = checkpoints_delete(actor=actor, project=project, checkpoint_ids=sorted(planned & going), cause=cause)
    protected = {checkpoint.pk: reason for run_plan in fresh for checkpoint, reason in run_plan.protected}
    protected.update(outcome.refused)  # what became protected since ``fresh``, under the row locks
    applied = Applied(deleted=outcome.deleted, bytes=outcome.bytes)
    left = planned - {row.pk for row in outcome.deleted}
    rows = Checkpoint.objects.filter(pk__in=left, run__project=project).select_related("run")
    for row in rows.order_by("run_id", "step"):
        reason = _why_kept(row, protected.get(row.pk))
        applied.refused[row.pk] = reason
        applied.skipped.append((row, reason))
    RetentionPolicy.objects.filter(pk=saved.pk).update(last_applied_at=timezone.now())
    _audit_deleted(actor=actor, project=project, action="retention_policy.apply", outcome=applied)
    return applied


def _why_kept(row: Checkpoint, protection: str | None) -> str:
    """The sentence for a planned checkpoint ``row`` that apply did not delete."""
    if row.state == CheckpointState.DELETED:
        return _("The checkpoint at step %(step)s is already deleted.") % {"step": row.step}
    return protection or _("The checkpoint at step %(step)s is kept by the saved retention policy now.") % {
        "step": row.step
    }


def runs_checkpoints_delete(*, actor, project: Project, run_ids: list[int]) -> Deleted:
    """Bulk delete from the Runs table: every checkpoint of the Runs ``run_ids`` (of ``project``) that no
    protection holds; the protected ones are refused with their sentence. Project admin only (``Forbidden``)."""
    ids = list(
        Checkpoint.objects.filter(run__project=project, run_id__in=run_ids)
        .exclude(state__in=(CheckpointState.DELETED, CheckpointState.PENDING))
        .values_list("pk", flat=True)
    )
    outcome = checkpoints_delete(actor=actor, project=project, checkpoint_ids=ids, cause=CheckpointDeletion.Cause.BULK)
    _audit_deleted(actor=actor, project=project, action="checkpoint.bulk_delete", outcome=outcome)
    return outcome


def retention_apply_scheduled() -> int:
    """Apply every policy an admin scheduled and not applied in the last day, as the admin who saved it; a
    policy whose saver is no longer an admin of its Project is skipped (logged). Each plans and applies in one
    transaction under apply's rule. Returns how many applied."""
    due = RetentionPolicy.objects.filter(scheduled=True).exclude(last_applied_at__gt=timezone.now() - SCHEDULE_EVERY)
    applied = 0
    for due_one in due.select_related("project"):
        project = due_one.project
        with transaction.atomic():
            saved = _saved(project)  # locked: the rules and saver that apply are the ones committed now
            actor = saved.updated_by
            if not saved.scheduled or actor is None or not policy.has_role(actor, project, policy.ADMIN):
                logger.warning("retention policy of %s not applied: whoever scheduled it is no admin", project)
                continue
            fresh = retention_plan(project=project, rules=Rules.of(saved))
            planned = {checkpoint.pk for run_plan in fresh for checkpoint in run_plan.going}
            cause = CheckpointDeletion.Cause.SCHEDULE
            _apply(actor=actor, project=project, saved=saved, planned=planned, fresh=fresh, cause=cause)
        applied += 1
    return applied
