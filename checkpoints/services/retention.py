"""Retention policies and bulk deletion (docs/design/checkpoints.md#retention, #deletion).

An admin sets a Project's policy, previews it (``checkpoints.retention.retention_plan``) and applies it; with
``scheduled`` beat applies it once a day as the admin who last saved it. Nothing is deleted otherwise. Every
deletion goes through ``deletion.checkpoints_delete`` and its one protection check.
"""

import logging
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from checkpoints.models import Checkpoint, CheckpointDeletion, CheckpointState, RetentionPolicy
from checkpoints.retention import Rules, retention_plan
from checkpoints.services.deletion import Deleted, checkpoints_delete
from mado import policy
from mado.audit import audit_record
from mado.errors import ValidationFailed
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


def retention_apply(*, actor, project: Project, cause: str = CheckpointDeletion.Cause.POLICY) -> Deleted:
    """Apply ``project``'s saved policy: delete what ``retention_plan`` lists as going, through the protection
    check again under the Runs' row locks (a checkpoint that became a source since the preview stays).

    Project admin only (``Forbidden``); no saved policy → ``ValidationFailed``. Returns ``Deleted``.
    """
    policy.require_role(actor, project, policy.ADMIN)
    saved = RetentionPolicy.objects.filter(project=project).first()
    if saved is None:
        raise ValidationFailed("this project has no retention policy; save one first", field="policy")
    plans = retention_plan(project=project, rules=Rules.of(saved))
    ids = [checkpoint.pk for plan in plans for checkpoint in plan.going]
    outcome = checkpoints_delete(actor=actor, project=project, checkpoint_ids=ids, cause=cause)
    RetentionPolicy.objects.filter(pk=saved.pk).update(last_applied_at=timezone.now())
    _audit_deleted(actor=actor, project=project, action="retention_policy.apply", outcome=outcome)
    return outcome


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
    policy whose saver is no longer an admin of its Project is skipped (logged). Returns how many applied."""
    due = RetentionPolicy.objects.filter(scheduled=True).exclude(last_applied_at__gt=timezone.now() - SCHEDULE_EVERY)
    applied = 0
    for saved in due.select_related("project", "updated_by"):
        if saved.updated_by is None or not policy.has_role(saved.updated_by, saved.project, policy.ADMIN):
            logger.warning("retention policy of %s not applied: whoever scheduled it is no admin", saved.project)
            continue
        retention_apply(actor=saved.updated_by, project=saved.project, cause=CheckpointDeletion.Cause.SCHEDULE)
        applied += 1
    return applied
