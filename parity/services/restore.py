"""The restore report a resumed Run's SDK sends after loading its checkpoint (docs/design/resume.md#restore-report).

``{"checkpoint_id": int | null, "parts": {part: "restored" | "not_restored" | "unknown" | "not_declared"},
"details": {part: one line}}`` (``not_declared``: a part the checkpoint cannot describe, its detail naming the call
that declares it; docs/design/checkpoints.md#restore-check); part names: ``model``, ``optimizer``,
``scheduler``, ``scaler`` (each optionally ``.<n>`` for a second one), ``rng.python``, ``rng.numpy``,
``rng.torch``, ``rng.cuda.<device>``, ``generator.<name>``, ``data_position``, ``global_step``.
"""

import re

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from checkpoints.models import Checkpoint
from mado import policy
from mado.errors import ValidationFailed
from parity.models import RestorePart, RestoreReport
from parity.services.segments import segment_restore_snapshot
from runs.lease import lease_check
from runs.models import Run

PART_NAME = re.compile(
    r"(?:model|optimizer|scheduler|scaler)(?:\.[0-9]{1,3})?|rng\.(?:python|numpy|torch)|rng\.cuda\.[0-9]{1,4}"
    r"|generator\.[A-Za-z0-9_.-]{1,100}|data_position|global_step"
)
PARTS_MAX = 128
DETAIL_MAX = 500
_FIELDS = ("checkpoint_id", "parts", "details")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PART_RULE = (
    "model, optimizer, scheduler, scaler (or one of them followed by .<n>), rng.python, rng.numpy, rng.torch, "
    "rng.cuda.<device>, generator.<name>, data_position or global_step"
)


def _field(prefix: str, name) -> str:
    """``prefix.name`` for a readable part name, else ``prefix`` alone (an error never echoes a hostile key)."""
    if isinstance(name, str) and PART_NAME.fullmatch(name):
        return f"{prefix}.{name}"
    return prefix


def _shown(name) -> str:
    text = repr(name)
    return text if len(text) <= 40 else text[:37] + "..."


def clean_restore_report(body) -> tuple[int | None, dict[str, str], dict[str, str]]:
    """``(checkpoint_id, parts, details)`` of a restore report body (docs/design/resume.md#restore-report).

    Raises ``ValidationFailed`` naming the field (``body``, ``checkpoint_id``,
    ``parts``, ``parts.<part>``, ``details``, ``details.<part>`` or the
    unknown field) for: a body that is not an object or has another field; a
    ``checkpoint_id`` that is not a positive integer or null; ``parts`` not an
    object of 1 to 128 known part names each mapped to ``restored``,
    ``not_restored``, ``unknown`` or ``not_declared``; ``details`` not an object of one-line
    strings (at most 500 characters, no control character) about parts
    listed in ``parts``.
    """
    if not isinstance(body, dict):
        raise ValidationFailed("the body must be a JSON object {checkpoint_id, parts, details}", field="body")
    for name in body:
        if name not in _FIELDS:
            raise ValidationFailed(
                f"unknown field {_shown(name)}; a restore report has {', '.join(_FIELDS)}",
                field=name if name.isidentifier() and len(name) <= 40 else "body",
            )
    checkpoint_id = body.get("checkpoint_id")
    if checkpoint_id is not None and (type(checkpoint_id) is not int or not 0 < checkpoint_id < 2**63):
        raise ValidationFailed(
            "checkpoint_id must be a checkpoint's id (a positive integer) or null", field="checkpoint_id"
        )
    parts = _parts(body.get("parts"))
    return checkpoint_id, parts, _details(body.get("details"), parts)


def _parts(parts) -> dict[str, str]:
    if not isinstance(parts, dict) or not parts:
        raise ValidationFailed(
            'parts must be a non-empty object {"<part>": "restored" | "not_restored" | "unknown" | "not_declared"}',
            field="parts",
        )
    if len(parts) > PARTS_MAX:
        raise ValidationFailed(f"parts holds at most {PARTS_MAX} parts, got {len(parts)}", field="parts")
    for name, state in parts.items():
        if not PART_NAME.fullmatch(name):
            raise ValidationFailed(f"unknown part {_shown(name)}: a part is {_PART_RULE}", field="parts")
        if state not in RestorePart.values:
            raise ValidationFailed(
                f"{name} must be restored, not_restored, unknown or not_declared, got {_shown(state)}",
                field=f"parts.{name}",
            )
    return dict(sorted(parts.items()))


def _details(details, parts: dict[str, str]) -> dict[str, str]:
    if details is None:
        return {}
    if not isinstance(details, dict):
        raise ValidationFailed('details must be an object {"<part>": "one line"}', field="details")
    for name, line in details.items():
        if name not in parts:
            raise ValidationFailed(
                f"details names {_shown(name)}, which parts does not list", field=_field("details", name)
            )
        if not isinstance(line, str) or len(line) > DETAIL_MAX or _CONTROL.search(line):
            raise ValidationFailed(
                f"the detail of {name} must be one line of at most {DETAIL_MAX} characters", field=f"details.{name}"
            )
    return dict(sorted(details.items()))


LINEAGE_MAX = 1000  # parents followed at most: a chain of resumes and continues is far shorter


def _require_lineage_checkpoint(run: Run, checkpoint_id: int) -> None:
    """``ValidationFailed`` on ``checkpoint_id`` unless it is a checkpoint ``run`` may have resumed from: its source
    checkpoint, or one of its own or of its parents' up the chain (docs/design/resume.md#restore-report). Another
    Run's checkpoint would put a step on the report (and on a resume segment) that this Run never had."""
    owner = (
        Checkpoint.objects.filter(pk=checkpoint_id, run__project_id=run.project_id).values_list("run_id", flat=True)
    ).first()
    if owner is None:
        raise ValidationFailed(f"no checkpoint {checkpoint_id} in this run's project", field="checkpoint_id")
    if checkpoint_id == run.source_checkpoint_id:
        return
    ancestor, seen = run.pk, 0
    while ancestor is not None and seen < LINEAGE_MAX:
        if ancestor == owner:
            return
        ancestor = Run.objects.filter(pk=ancestor).values_list("parent_id", flat=True).first()
        seen += 1
    raise ValidationFailed(
        f"checkpoint {checkpoint_id} belongs to another run: a restore report names a checkpoint of this run or "
        "of the runs it was resumed or continued from",
        field="checkpoint_id",
    )


def restore_report_record(*, actor, run: Run, body, fencing_token: int | None = None) -> tuple[RestoreReport, bool]:
    """Store ``run``'s restore report ``body`` (docs/design/resume.md#restore-report); ``(report, created)``.

    One report per Run: a later one (the SDK's retry, or its second look at
    the first ``log_metrics``) replaces the parts, details and checkpoint and
    counts in ``reports``; ``reported_at`` is the time of the last one.
    Raises ``Forbidden`` unless ``actor`` writes to the Run
    (docs/design/runs.md#write-rule), ``ValidationFailed`` naming the field
    (``clean_restore_report``; ``checkpoint_id`` of no checkpoint in the Run's
    Project, or of another Run's than this one's and its parents'), ``LeaseLost``
    for a stale ``fencing_token`` (None: not fenced; docs/design/runs.md#one-writer-process). A refused report
    changes nothing. A Run resumed under its id also keeps the report on its latest resume segment
    (docs/design/resume.md#same-run-parity).
    """
    policy.require_run_writer(actor, run)
    checkpoint_id, parts, details = clean_restore_report(body)
    if checkpoint_id is not None:
        _require_lineage_checkpoint(run, checkpoint_id)
    values = {"checkpoint_id": checkpoint_id, "parts": parts, "details": details, "reported_at": timezone.now()}
    with transaction.atomic():
        lease_check(run_id=run.pk, token=fencing_token)
        created = False
        if not RestoreReport.objects.filter(run_id=run.pk).update(**values, reports=F("reports") + 1):
            try:
                with transaction.atomic():
                    RestoreReport.objects.create(run_id=run.pk, **values)
                created = True
            except IntegrityError:  # a concurrent first report won: this one replaces it
                RestoreReport.objects.filter(run_id=run.pk).update(**values, reports=F("reports") + 1)
        segment_restore_snapshot(
            run=run, checkpoint_id=checkpoint_id, parts=parts, details=details, fencing_token=fencing_token
        )
    return RestoreReport.objects.get(run_id=run.pk), created
