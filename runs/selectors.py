"""Reads used by pages and the API (STYLE: Selectors). Every lookup is scoped to the user's Projects."""

from django.db.models import QuerySet

from mado.errors import NotFound, ValidationFailed
from runs.models import Code, Dataset, MetricPoint, Project, Run, RunKind, RunStatus


def project_list(*, user) -> QuerySet[Project]:
    """Projects the user is a member of (any role), by name."""
    return Project.objects.visible_to(user).order_by("name")


def project_get_for_user(*, user, slug: str) -> Project:
    """The Project with ``slug`` if the user is a member; else ``NotFound`` (404, ARCHITECTURE rule 1)."""
    project = Project.objects.visible_to(user).filter(slug=slug).first()
    if project is None:
        raise NotFound(f"project {slug!r} not found", field="project")
    return project


def run_list(*, user, project: Project | None = None, status: str | None = None, kind: str | None = None):
    """Runs visible to the user, newest first, optionally filtered.

    Raises ``ValidationFailed`` (400) naming ``status`` or ``kind`` for an unknown value.
    """
    runs = Run.objects.visible_to(user).select_related("project", "created_by")
    if project is not None:
        runs = runs.filter(project=project)
    if status:
        if status not in RunStatus.values:
            raise ValidationFailed(f"unknown status {status!r}; one of {', '.join(RunStatus.values)}", field="status")
        runs = runs.filter(status=status)
    if kind:
        if kind not in RunKind.values:
            raise ValidationFailed(f"unknown kind {kind!r}; one of {', '.join(RunKind.values)}", field="kind")
        runs = runs.filter(kind=kind)
    return runs.order_by("-created_at", "-id")


def run_get_for_user(*, user, run_id) -> Run:
    """The Run with primary key ``run_id`` in one of the user's Projects; else ``NotFound`` (404)."""
    try:
        run_id = int(run_id)
    except (TypeError, ValueError):
        raise NotFound(f"run {run_id!r} not found", field="run") from None
    run = Run.objects.visible_to(user).select_related("project", "created_by", "parent", "code_version").filter(
        pk=run_id
    ).first()
    if run is None:
        raise NotFound(f"run {run_id} not found", field="run")
    return run


def code_get_for_user(*, user, code_id) -> Code:
    """A Code in one of the user's Projects; else ``NotFound``."""
    code = Code.objects.visible_to(user).select_related("project").filter(pk=_int_or_none(code_id)).first()
    if code is None:
        raise NotFound(f"code {code_id!r} not found", field="code")
    return code


def dataset_get_for_user(*, user, dataset_id) -> Dataset:
    """A Dataset in one of the user's Projects; else ``NotFound``."""
    dataset = Dataset.objects.visible_to(user).select_related("project").filter(pk=_int_or_none(dataset_id)).first()
    if dataset is None:
        raise NotFound(f"dataset {dataset_id!r} not found", field="dataset")
    return dataset


def metric_keys(*, run: Run) -> list[str]:
    """The distinct metric keys logged in ``run``, sorted."""
    return sorted(MetricPoint.objects.filter(run=run).values_list("key", flat=True).distinct())


def metric_history(
    *, run: Run, key: str, after_step: int | None = None, limit: int | None = None
) -> list[tuple[int, float, int]]:
    """``(step, value, timestamp_ms)`` of ``key`` in ``run`` ordered by step (then insertion).

    ``after_step`` keeps points with a larger step (keyset paging); ``limit``
    caps the count. NaN comes back as ``math.nan`` (SPEC F2 reads these).
    """
    points = MetricPoint.objects.filter(run=run, key=key)
    if after_step is not None:
        points = points.filter(step__gt=after_step)
    rows = points.order_by("step", "id").values_list("step", "value", "timestamp")
    if limit is not None:
        rows = rows[:limit]
    to_value = MetricPoint.from_db_value
    return [(step, to_value(value), ts) for step, value, ts in rows]


def metric_count(*, run: Run, key: str) -> int:
    """How many points of ``key`` the run holds."""
    return MetricPoint.objects.filter(run=run, key=key).count()


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
