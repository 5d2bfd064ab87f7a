"""Reading the audit log (docs/api.md#audit): who sees which records, filters, CSV.

The records are written by ``mado.audit`` (the ground); reading them needs
the Projects a user administers, which this app knows. A Project admin sees
the records of the Projects they administer, a superuser every record.
"""

import csv
import io
from datetime import datetime

from django.db.models import QuerySet

from mado import policy
from mado.errors import ValidationFailed
from mado.models import AuditEvent
from runs.models import Project

CSV_COLUMNS = [
    "created_at",
    "actor_kind",
    "actor_name",
    "via",
    "action",
    "object_type",
    "object_id",
    "object_repr",
    "project_id",
    "changes",
    "address",
    "request_id",
]


def audit_list(
    *,
    user,
    project: Project | None = None,
    action: str = "",
    actor: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """The records ``user`` may read, newest first: of ``project`` (None: every Project they administer, and for
    a superuser every record), whose ``action`` starts with ``action`` (``"run."``: every Run record), by the
    actor named ``actor``, from ``since`` (inclusive) to ``until`` (exclusive). Raises ``ValidationFailed``
    (field ``since``) when ``since`` is after ``until``.
    """
    if since and until and since > until:
        raise ValidationFailed("since must be before until", field="since")
    events = AuditEvent.objects.all()
    if not user.is_superuser:
        administered = Project.objects.filter(policy.membership_q(user, role=policy.ADMIN)).values("pk")
        events = events.filter(project_id__in=administered)
    if project is not None:
        events = events.filter(project_id=project.pk)
    if action:
        events = events.filter(action__startswith=action)
    if actor:
        events = events.filter(actor_name=actor)
    if since:
        events = events.filter(created_at__gte=since)
    if until:
        events = events.filter(created_at__lt=until)
    return events


def _cell(value) -> str:
    text = "" if value is None else str(value)
    # a spreadsheet would run a cell starting with one of these as a formula
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def audit_csv_lines(events: QuerySet[AuditEvent]):
    """The records as CSV lines (a header first), streamed a chunk of rows at a time."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for event in events.iterator(chunk_size=500):
        writer.writerow([_cell(getattr(event, column)) for column in CSV_COLUMNS])
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()
