"""Reads used by pages and the API (docs/design/house.md#where-logic-goes). Every lookup is scoped to the user's
Projects."""

import functools
import hashlib
import math
import operator

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, F, Max, Min, OuterRef, Q, QuerySet, Subquery

from mado import policy
from mado.db import id_or_none
from mado.errors import NotFound, ValidationFailed
from runs.chunk_pages import chunk_page_rows
from runs.metric_rollup import ROLLUP_STEPS, rollup_extremes, rollup_part_extremes, rollup_rows
from runs.models import (
    Code,
    CodeVersion,
    Dataset,
    DatasetVersion,
    Membership,
    MetricPoint,
    MetricSummary,
    Project,
    Run,
    RunKind,
    RunStatus,
)
from runs.stages import (  # noqa: F401 (docs/design/runs.md#data-stages)
    data_composition_at,
    data_stage_histories,
    data_stage_history,
    why_cannot_record_stage,
)

_INT64_MAX = 2**63 - 1  # steps are BIGINT


def project_list(*, user) -> QuerySet[Project]:
    """Projects the user is a member of (any role), by name."""
    return Project.objects.visible_to(user).order_by("name")


def project_get_for_user(*, user, slug: str) -> Project:
    """The Project with ``slug`` if the user is a member; else ``NotFound`` (404, docs/design/house.md#one-policy).

    The refusal repeats the slug asked for (at most 100 characters) and says how a Project is made; it reads the
    same whether another user's Project has that slug or none has, so it tells nobody what exists
    (docs/design/runs.md#write-rule).
    """
    project = Project.objects.visible_to(user).filter(slug=slug).first()
    if project is None:
        raise NotFound(
            f"no project {str(slug)[:100]!r} among your projects: create it (POST /api/v1/projects/ with its name "
            "and slug) or ask its admin to add you",
            field="project",
        )
    return project


def run_list(
    *,
    user,
    project: Project | None = None,
    status: str | None = None,
    kind: str | None = None,
    external_id: str | None = None,
):
    """Runs visible to the user, newest first, optionally filtered (``external_id``: the run id,
    docs/design/runs.md#resume-modes).

    Raises ``ValidationFailed`` (400) naming ``status`` or ``kind`` for an unknown value.
    """
    # Runs of the visible Projects (a semi-join): no DISTINCT over every run's columns, which costs seconds at
    # 10,000 runs with their parameters.
    runs = Run.objects.filter(project__in=Project.objects.visible_to(user).values("pk"))
    runs = runs.select_related("project", "created_by")
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
    if external_id:
        runs = runs.filter(external_id=external_id)
    return runs.order_by("-created_at", "-id")


RUN_RELATED = ("project", "created_by", "parent", "code_version")


def run_get_for_user(*, user, run_id, related: tuple[str, ...] = RUN_RELATED) -> Run:
    """The Run with primary key ``run_id`` in one of the user's Projects; else ``NotFound`` (404).

    ``related``: the relations read in the same query (default: what Run pages and answers show). The metrics
    POST, the hot path, asks for ``("project",)`` only and the metrics reads for none: each join costs a slice
    of database CPU (docs/design/resume.md#steps-continue).
    """
    try:
        run_id = int(run_id)
    except (TypeError, ValueError):
        raise NotFound(f"run {run_id!r} not found", field="run") from None
    # The membership row that makes the Run visible is joined anyway: its role comes along for the policy.
    run = (
        Run.objects.visible_to(user)
        .select_related(*related)
        .annotate(viewer_role=F("project__memberships__role"))
        .filter(pk=run_id)
        .first()
    )
    if run is None:
        raise NotFound(f"run {run_id} not found", field="run")
    if "project" in related:
        policy.remember_role(user, run.project, run.viewer_role)
    return run


def code_get_for_user(*, user, code_id) -> Code:
    """A Code in one of the user's Projects; else ``NotFound``."""
    code = Code.objects.visible_to(user).select_related("project").filter(pk=id_or_none(code_id)).first()
    if code is None:
        raise NotFound(f"code {code_id!r} not found", field="code")
    return code


def dataset_get_for_user(*, user, dataset_id) -> Dataset:
    """A Dataset in one of the user's Projects; else ``NotFound``."""
    dataset = Dataset.objects.visible_to(user).select_related("project").filter(pk=id_or_none(dataset_id)).first()
    if dataset is None:
        raise NotFound(f"dataset {dataset_id!r} not found", field="dataset")
    return dataset


def dataset_list(*, project: Project) -> QuerySet[Dataset]:
    """The Datasets of ``project`` (the caller has checked visibility), by name."""
    return Dataset.objects.filter(project=project).order_by("name", "id")


def dataset_version_list(*, dataset: Dataset) -> QuerySet[DatasetVersion]:
    """The versions of ``dataset``, newest first."""
    return DatasetVersion.objects.filter(dataset=dataset).order_by("-created_at", "-id")


def code_list(*, project: Project) -> QuerySet[Code]:
    """The Codes of ``project`` (the caller has checked visibility), by name."""
    return Code.objects.filter(project=project).order_by("name", "id")


def code_version_list(*, code: Code) -> QuerySet[CodeVersion]:
    """The versions of ``code`` with their archive Artifact, newest (highest number) first."""
    return CodeVersion.objects.filter(code=code).select_related("archive").order_by("-version")


def metric_keys(*, run: Run) -> list[str]:
    """The distinct metric keys logged in ``run``, sorted; read from its summaries (O(keys),
    docs/design/resume.md#steps-continue)."""
    return list(MetricSummary.objects.filter(run=run).order_by("key").values_list("key", flat=True))


def metric_history(*, run: Run, key: str, offset: int = 0, limit: int | None = None) -> list[tuple[int, float, int]]:
    """``(step, value, timestamp_ms)`` of ``key`` in ``run`` ordered by step (then insertion).

    ``offset`` skips that many points and ``limit`` caps the count (page
    ``p`` of size ``n`` is ``offset=(p - 1) * n, limit=n``). NaN comes back as
    ``math.nan``, ±Infinity as ``±math.inf``; ``timestamp_ms`` is Unix
    milliseconds (the metric reads of docs/design/resume.md#steps-continue).
    """
    to_value = MetricPoint.from_db_value
    if connection.vendor == "postgresql" and limit is not None:  # slices of the chunks the page spans
        page = chunk_page_rows(run_id=run.pk, key=key, offset=offset, limit=limit)
        if page is not None:
            return [(step, to_value(value), ts) for step, value, ts in page]
    rows = MetricPoint.objects.filter(run=run, key=key).order_by("step", "id").values_list("step", "value", "timestamp")
    if offset or limit is not None:
        rows = rows[offset : None if limit is None else offset + limit]
    return [(step, to_value(value), ts) for step, value, ts in rows]


def metric_count(*, run: Run, key: str) -> int:
    """How many points of ``key`` the run holds (0 for an unknown key); one summary row, not a count of points."""
    return MetricSummary.objects.filter(run=run, key=key).values_list("count", flat=True).first() or 0


# --- pages (docs/design/interfaces.md#surfaces) ----------------------------------------------------------------


def project_list_with_roles(*, user) -> QuerySet[Project]:
    """The user's Projects by name, each annotated with ``role`` (the user's role in it) and ``run_count``."""
    role = Membership.objects.filter(project=OuterRef("pk"), user=user).values("role")[:1]
    return (
        project_list(user=user).annotate(role=Subquery(role), run_count=Count("runs", distinct=True)).order_by("name")
    )


def membership_list(*, project: Project):
    """The members of ``project`` with their user, by username. The caller has checked visibility."""
    return project.memberships.select_related("user").order_by("user__username")


def run_children(*, user, run: Run) -> QuerySet[Run]:
    """Runs whose parent is ``run`` (resumed or continued from it), oldest first, limited to the user's Projects."""
    return Run.objects.visible_to(user).filter(parent=run).select_related("created_by").order_by("created_at", "id")


def run_input_dataset_versions(*, run: Run):
    """The Run's initial input dataset versions with their Dataset, by dataset name then version."""
    return run.input_dataset_versions.select_related("dataset").order_by("dataset__name", "version")


def metric_chart_series(
    *, run: Run, key: str, max_points: int = 1000, before_step: int | None = None, with_timestamps: bool = False
) -> tuple[list[tuple], int, int]:
    """The points of ``key`` to draw, reduced in the database: ``(points, non_finite_count, total_count)``.

    ``points`` are finite ``(step, value)`` pairs ordered by step, at most
    ``max_points`` (>= 2). Above that, the step range is cut into at most
    ``max_points // 2`` equal buckets and each bucket keeps the rows holding its
    smallest and its largest value (the lowest step on a tie), so spikes (a
    diverging loss) survive the reduction. A key (or its part below
    ``before_step``) spanning at least a quarter as many ``ROLLUP_STEPS``-step
    rollup buckets as that is read from its rollups (``runs.metric_rollup``;
    buckets of whole rollup buckets from the key's first, so there may be
    fewer): a million-point key costs some 4,000 rows, not a million (docs/design/interfaces.md#workspace).
    NaN (stored NULL) and ±Infinity are counted, never drawn (docs/design/resume.md#steps-continue;
    docs/design/interfaces.md#surfaces). With ``before_step``, only points at steps below it count (an ancestor's curve
    up to where its child resumed). ``with_timestamps`` adds each point's Unix milliseconds: ``(step, value,
    timestamp_ms)``.
    """
    reduced = _rolled_up_series(run, key, max_points, before_step)
    if reduced is not None:
        rows, non_finite, total = reduced
        return (rows if with_timestamps else [row[:2] for row in rows]), non_finite, total
    fields = ("step", "value", "timestamp") if with_timestamps else ("step", "value")
    points = MetricPoint.objects.filter(run=run, key=key)
    if before_step is not None:
        points = points.at_steps(high=before_step - 1)
    non_finite = Q(value__isnull=True) | Q(value__in=[math.inf, -math.inf])
    stats = points.aggregate(total=Count("id"), bad=Count("id", filter=non_finite), low=Min("step"), high=Max("step"))
    finite = points.exclude(non_finite)
    if stats["total"] - stats["bad"] <= max_points:
        rows = finite.order_by("step", "id").values_list(*fields)
        return list(rows), stats["bad"], stats["total"]
    buckets = max(max_points // 2, 1)
    width = -(-(stats["high"] - stats["low"] + 1) // buckets)
    return _bucket_extremes(run.pk, key, before_step, stats["low"], width, fields), stats["bad"], stats["total"]


def _rolled_up_series(run: Run, key: str, max_points: int, before_step: int | None):
    """``metric_chart_series`` of a key read from its rollups (``runs.metric_rollup``), or None when the points
    serve: the key fits in ``max_points``, or spans fewer than a quarter as many rollup buckets as the chart has (it
    would be drawn too coarsely; such a key's points lie within ``ROLLUP_STEPS * max_points / 8`` steps)."""
    summary = MetricSummary.objects.filter(run=run, key=key).values_list("count", "first_step", "last_step").first()
    if summary is None or summary[0] <= max_points or (before_step is not None and before_step <= summary[1]):
        return None
    _count, low, high = summary
    high = high if before_step is None else min(high, before_step - 1)
    buckets = max(max_points // 2, 1)
    spanned = high // ROLLUP_STEPS - low // ROLLUP_STEPS + 1
    if spanned < buckets // 4:
        return None
    per_part = -(-spanned // buckets)
    whole_buckets = before_step is None or before_step % ROLLUP_STEPS == 0
    if whole_buckets and connection.vendor == "postgresql":  # the database groups them (arrays: PostgreSQL's)
        points, total, non_finite = rollup_part_extremes(
            run_id=run.pk,
            key=key,
            first_bucket=low // ROLLUP_STEPS,
            buckets_per_part=per_part,
            before_bucket=None if before_step is None else before_step // ROLLUP_STEPS,
        )
        return None if total - non_finite <= max_points else (points, non_finite, total)
    rows = rollup_rows(run_id=run.pk, key=key, before_step=before_step)
    total, non_finite = sum(row[1] for row in rows), sum(row[2] for row in rows)
    if total - non_finite <= max_points:
        return None
    points = rollup_extremes(rows, first_bucket=low // ROLLUP_STEPS, buckets_per_part=per_part)
    return points, non_finite, total


_EXTREMES = """
WITH points AS (
    SELECT id, step, value, timestamp, (step - %s) / %s AS bucket FROM {table}
    WHERE run_id = %s AND key = %s AND value IS NOT NULL AND value <> %s AND value <> %s AND step < %s
          AND chunk_first_step < %s
), extremes AS (
    SELECT bucket, MIN(value) AS lo, MAX(value) AS hi FROM points GROUP BY bucket
), hits AS (
    SELECT p.step, p.value, p.timestamp,
           ROW_NUMBER() OVER (PARTITION BY p.bucket, p.value ORDER BY p.step, p.id) AS n
    FROM points p JOIN extremes e ON p.bucket = e.bucket
    WHERE p.value = e.lo OR p.value = e.hi
)
SELECT {fields} FROM hits WHERE n = 1 ORDER BY step, value
"""


def _bucket_extremes(run_id: int, key: str, before_step, low: int, width: int, fields) -> list[tuple]:
    """Per step bucket, the points holding its smallest and largest finite value (the lowest step on a tie).

    A hash aggregate finds each bucket's extremes and a hash join the rows
    holding them: two passes over the key's index range and no sort of the
    key (only the matched rows are ranked), where ranking every row by value
    per bucket spilled to disk for a million-point key.
    """
    sql = _EXTREMES.format(table=MetricPoint._meta.db_table, fields=", ".join(fields))
    upper = _INT64_MAX if before_step is None else before_step
    with connection.cursor() as cursor:
        cursor.execute(sql, [low, width, run_id, key, math.inf, -math.inf, upper, upper])
        return cursor.fetchall()


CHART_CACHE_S = 3600


def metric_chart_series_remembered(*, run: Run, key: str, max_points: int, before_step: int | None = None):
    """``metric_chart_series(..., with_timestamps=True)``, kept in Django's cache while the key's summary (count,
    last step, last timestamp) is unchanged. Points are only ever added, so an unchanged summary means the same
    points: a finished run's million-point key is reduced once, not on every view of its page
    (docs/design/interfaces.md#workspace)."""
    summary = MetricSummary.objects.filter(run=run, key=key).values_list("count", "last_step", "last_timestamp").first()
    digest = hashlib.sha256(repr((run.pk, run.created_at, key, max_points, before_step, summary)).encode()).hexdigest()
    found = cache.get(f"chart-series:{digest}")
    if found is None:
        found = metric_chart_series(
            run=run, key=key, max_points=max_points, before_step=before_step, with_timestamps=True
        )
        cache.set(f"chart-series:{digest}", found, CHART_CACHE_S)
    return found


def metric_chart_series_many(
    *, runs: list[Run], max_points: int = 1000, keys: Q = Q()
) -> dict[tuple[int, str], tuple[list[tuple], int, int]]:
    """``metric_chart_series(..., with_timestamps=True)`` of every key (matching ``keys``) of every Run in
    ``runs``, keyed by ``(run id, key)``, in few queries: the summaries say which series fit in ``max_points``,
    one query reads all of those whole, and only a larger series is reduced on its own (Run page, Compare,
    docs/design/interfaces.md#workspace).
    """
    by_id = {run.pk: run for run in runs}
    series, wanted, large = {}, {}, set()
    for run_id, key, count in (
        MetricSummary.objects.filter(run__in=runs).filter(keys).values_list("run_id", "key", "count")
    ):
        if count <= max_points:
            series[(run_id, key)] = [[], 0, count]
            wanted.setdefault(run_id, []).append(key)
        else:
            large.add(run_id)
            series[(run_id, key)] = metric_chart_series_remembered(run=by_id[run_id], key=key, max_points=max_points)
    # One index range per Run: the points of a large series are never read here. A Run whose keys are all small
    # is read by its id alone; naming each of its keys (50 Runs x 100 keys) made a predicate the database
    # evaluated on every row.
    small = MetricPoint.objects.none()
    if wanted:
        whole = [run_id for run_id in wanted if run_id not in large]
        pairs = [Q(run_id=run_id, key__in=wanted[run_id]) for run_id in wanted if run_id in large]
        if whole:
            pairs.append(Q(run_id__in=whole) & keys)
        small = MetricPoint.objects.filter(functools.reduce(operator.or_, pairs))
    isfinite = math.isfinite
    for run_id, key, step, value, timestamp in small.order_by("run_id", "key", "step", "id").values_list(
        "run_id", "key", "step", "value", "timestamp"
    ):
        entry = series.setdefault((run_id, key), [[], 0, 0])  # points and summary are written together
        if value is None or not isfinite(value):
            entry[1] += 1
        else:
            entry[0].append((step, value, timestamp))
    return {pair: tuple(entry) for pair, entry in series.items()}


# --- Jobs pages: launch form, lineage, ancestors' curves (docs/design/resume.md#steps-continue, #from-a-checkpoint) ---


def code_version_choices(*, project: Project) -> QuerySet[CodeVersion]:
    """Every version of every Code of ``project`` (the Launch Job form's select), by Code name then newest first."""
    return CodeVersion.objects.filter(code__project=project).select_related("code").order_by("code__name", "-version")


def dataset_version_choices(*, project: Project) -> QuerySet[DatasetVersion]:
    """Every dataset version of ``project`` (the Launch Job form's multi-select), by dataset name then version."""
    return (
        DatasetVersion.objects.filter(dataset__project=project)
        .select_related("dataset")
        .order_by("dataset__name", "version")
    )


def run_first_metric_step(*, run: Run) -> int | None:
    """The lowest step a training metric of ``run`` was logged at, or None before the first point (from its
    summaries). The SDK's system metrics (``system/…``) are left out: a sample taken before training's first log
    carries step 0 whatever step training resumes at (docs/design/interfaces.md#system-metrics)."""
    summaries = MetricSummary.objects.filter(run=run).exclude(key__startswith="system/")
    return summaries.aggregate(low=Min("first_step"))["low"]


def run_ancestors(*, user, run: Run, max_depth: int = 50) -> list[tuple[Run, int | None]]:
    """``run``'s parent chain, oldest first, each with the step its child resumed at
    (docs/design/resume.md#steps-continue).

    Each pair is ``(ancestor, until_step)``: the child of ``ancestor`` in the
    chain started from a checkpoint at ``until_step`` steps completed, so the
    ancestor's own points from that step on were redone by the child (None:
    the child recorded no source checkpoint, every point counts). Only Runs
    in the user's Projects are followed; at most ``max_depth`` ancestors (a
    guard against a corrupt cycle).
    """
    chain: list[tuple[Run, int | None]] = []
    seen = {run.pk}
    child = run
    visible = Run.objects.visible_to(user).select_related("source_checkpoint", "created_by")
    while child.parent_id and child.parent_id not in seen and len(chain) < max_depth:
        parent = visible.filter(pk=child.parent_id).first()
        if parent is None:
            break
        until = child.source_checkpoint.step if child.source_checkpoint_id else None
        chain.append((parent, until))
        seen.add(parent.pk)
        child = parent
    chain.reverse()
    return chain


def run_parameter_changes(*, run: Run) -> list:
    """The parameter values resumes changed with ``allow_param_change`` (docs/design/runs.md#resume-modes), oldest
    first, with ``changed_by``."""
    return list(run.parameter_changes.select_related("changed_by").order_by("changed_at", "id"))


def run_sweep_trial(*, run: Run):
    """The sweep trial ``run`` trains (docs/design/sweeps.md#requeue); None when the Run is not a trial.

    Read through the reverse one-to-one ``sweep_trial`` that the sweeps app's model adds to Run, so runs imports
    no sweeps module (docs/design/house.md#arrows); without the sweeps app there is no such attribute, also None.
    """
    return getattr(run, "sweep_trial", None)
