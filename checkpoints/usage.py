"""Reading the storage usage counters (docs/design/checkpoints.md#usage): what the Project page and the usage API
show. The counters (``StorageUsage``) are kept by the services that store and delete; nothing here lists the
storage or sums the artifacts."""

from datetime import timedelta

from django.db.models import Case, Count, F, Min, Q, Sum, When
from django.utils import timezone

from checkpoints.models import Checkpoint, CheckpointState, StorageUsage
from checkpoints.retention import Rules, retention_plan
from runs.models import Project, Run

AGES = ((7, "last_7_days"), (30, "last_30_days"), (90, "last_90_days"))
LARGEST = 10


def project_usage(*, project: Project) -> dict:
    """``{"bytes", "files", "by_kind": {kind: {"bytes", "files"}}, "largest_runs": [{"run_id", "name", "bytes"}],
    "checkpoints_by_age": {bucket: bytes}, "reclaimable": {"bytes", "checkpoints"}, "scrub": {...}}`` of ``project``
    (bytes; ``scrub`` as ``scrub_state``).

    ``largest_runs``: the ``LARGEST`` Runs holding most bytes. ``checkpoints_by_age``: bytes of complete
    checkpoints created in the last 7 / 30 / 90 days and ``older``. ``reclaimable``: complete checkpoints no
    deletion protection holds (what deleting every unprotected checkpoint would free).
    """
    rows = StorageUsage.objects.filter(project=project)
    by_kind = {kind: {"bytes": 0, "files": 0} for kind in StorageUsage.Kind.values}
    for kind, size, files in rows.values("kind").annotate(b=Sum("bytes"), f=Sum("files")).values_list("kind", "b", "f"):
        by_kind[kind] = {"bytes": size, "files": files}
    largest = (
        rows.exclude(run=None).values("run_id").annotate(total=Sum("bytes")).filter(total__gt=0).order_by("-total")
    )[:LARGEST]
    names = dict(Run.objects.filter(pk__in=[r["run_id"] for r in largest]).values_list("pk", "name"))
    plans = retention_plan(project=project, rules=Rules())
    return {
        "bytes": sum(v["bytes"] for v in by_kind.values()),
        "files": sum(v["files"] for v in by_kind.values()),
        "by_kind": by_kind,
        "largest_runs": [
            {"run_id": r["run_id"], "name": names.get(r["run_id"], ""), "bytes": r["total"]} for r in largest
        ],
        "checkpoints_by_age": _by_age(project),
        "reclaimable": {
            "bytes": sum(plan.bytes for plan in plans),
            "checkpoints": sum(len(plan.going) for plan in plans),
        },
        "scrub": scrub_state(project=project),
    }


def scrub_state(*, project: Project) -> dict:
    """``{"last_full_scrub", "verified", "complete", "corrupt"}`` of ``project``'s checkpoints
    (docs/design/checkpoints.md#scrubbing).

    ``last_full_scrub``: the time by which every complete checkpoint had been read back and matched (the oldest
    ``verified_at``), None while one has never been; ``verified`` of ``complete`` checkpoints have been;
    ``corrupt``: checkpoints found damaged by any reader.
    """
    checkpoints = Checkpoint.objects.filter(run__project=project)
    complete = Q(state=CheckpointState.COMPLETE)
    figures = checkpoints.aggregate(
        complete=Count("pk", filter=complete),
        verified=Count("pk", filter=complete & Q(verified_at__isnull=False)),
        oldest=Min("verified_at", filter=complete),
        corrupt=Count("pk", filter=Q(state=CheckpointState.CORRUPT)),
    )
    whole = figures["complete"] and figures["verified"] == figures["complete"]
    return {
        "last_full_scrub": figures["oldest"] if whole else None,
        "verified": figures["verified"],
        "complete": figures["complete"],
        "corrupt": figures["corrupt"],
    }


def run_usage(*, run: Run) -> dict:
    """``{"bytes", "files", "by_kind": {kind: {"bytes", "files"}}}`` stored for ``run``."""
    by_kind = {kind: {"bytes": 0, "files": 0} for kind in StorageUsage.Kind.values}
    for row in StorageUsage.objects.filter(run=run):
        by_kind[row.kind] = {"bytes": row.bytes, "files": row.files}
    return {
        "bytes": sum(v["bytes"] for v in by_kind.values()),
        "files": sum(v["files"] for v in by_kind.values()),
        "by_kind": by_kind,
    }


def _by_age(project: Project) -> dict[str, int]:
    now = timezone.now()
    stored = Case(When(layout="files", then=F("total_bytes")), default=F("tar_size"))
    buckets, previous = {}, None
    for days, name in AGES:
        since = now - timedelta(days=days)
        window = Q(created_at__gte=since) & (Q() if previous is None else Q(created_at__lt=previous))
        buckets[name] = Sum(stored, filter=window, default=0)
        previous = since
    buckets["older"] = Sum(stored, filter=Q(created_at__lt=previous), default=0)
    return Checkpoint.objects.filter(run__project=project, state=CheckpointState.COMPLETE).aggregate(**buckets)
