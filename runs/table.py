"""The project page's runs table (docs/design/interfaces.md#workspace): chosen columns, sort, filters, the search
language, CSV rows.

Columns are ``param:<name>`` (a parameter's value) and
``metric:<key>:<stat>`` (``last``, ``min`` or ``max`` of a metric key; NaN
is not a minimum or maximum). Before any choice the table shows the
parameters whose values vary across the latest runs and the last value of
up to ``DEFAULT_METRICS`` keys most of them log, as W&B shows its summary
columns.

Search (``docs/workspace.md``): terms joined by ``and``; a term is ``FIELD OP VALUE``
with ``OP`` one of ``= != > >= < <= ~`` (``~``: contains, case-insensitive)
and ``FIELD`` one of ``status``, ``kind``, ``creator``, ``tag``, ``name``,
``id`` or a parameter name (``lr>0.01 and status=finished``); a term
without an operator matches the name, the run id or any parameter text.
"""

import csv
import io
import json
import re
from dataclasses import dataclass

from django.db.models import Count, F, FilteredRelation, OuterRef, Q, QuerySet, Subquery, TextField
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast
from django.utils.translation import gettext as _

from mado.errors import ValidationFailed
from runs.charts import is_system_key
from runs.models import MetricSummary, Run, RunTableColumns
from runs.selectors import run_list

METRIC_STATS = ("last", "min", "max")
DEFAULT_METRICS = 5
DEFAULT_SAMPLE = 200  # the latest runs that pick the default columns
MAX_COLUMNS = 40
FIXED_SORTS = {
    "name": "name",
    "status": "status",
    "kind": "kind",
    "creator": "created_by__username",
    "started": "started_at",
    "created": "created_at",
}
_TERM = re.compile(r"^\s*([^\s<>=!~]+)\s*(>=|<=|!=|=|>|<|~)\s*(.*?)\s*$")
_LOOKUPS = {"=": "exact", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte", "~": "icontains"}
_RUN_FIELDS = {
    "status": "status",
    "kind": "kind",
    "creator": "created_by__username",
    "name": "name",
    "id": "external_id",
}


@dataclass(frozen=True)
class Column:
    """One chosen column: ``kind`` "param" or "metric"; ``name`` the parameter or metric key; ``stat`` for a
    metric; ``id`` the URL form (``param:lr``, ``metric:loss:last``); ``alias`` its annotation on the rows."""

    kind: str
    name: str
    stat: str = ""
    alias: str = ""

    @property
    def id(self) -> str:
        return f"param:{self.name}" if self.kind == "param" else f"metric:{self.name}:{self.stat}"

    @property
    def label(self) -> str:
        return self.name if self.kind == "param" else f"{self.name} ({self.stat})"


def parse_columns(values: list[str]) -> list[Column]:
    """``Column``s of the ``col`` values (``param:NAME`` / ``metric:KEY:STAT``), duplicates dropped, in order.

    Raises ``ValidationFailed`` (field ``col``) naming a malformed value, an unknown stat or more than
    ``MAX_COLUMNS`` columns.
    """
    columns, seen = [], set()
    for value in values:
        kind, _sep, rest = value.partition(":")
        if kind == "param" and rest:
            column = Column("param", rest)
        elif kind == "metric" and ":" in rest:
            key, _sep, stat = rest.rpartition(":")
            if stat not in METRIC_STATS or not key:
                raise ValidationFailed(
                    _("'%(value)s': the statistic must be one of %(choices)s")
                    % {"value": value, "choices": ", ".join(METRIC_STATS)},
                    field="col",
                )
            column = Column("metric", key, stat)
        else:
            raise ValidationFailed(
                _("'%(value)s': write param:NAME or metric:KEY:last|min|max") % {"value": value}, field="col"
            )
        if column.id not in seen:
            seen.add(column.id)
            columns.append(Column(column.kind, column.name, column.stat, alias=f"col{len(columns)}"))
    if len(columns) > MAX_COLUMNS:
        raise ValidationFailed(_("at most %(max)s columns") % {"max": MAX_COLUMNS}, field="col")
    return columns


def metric_keys_by_share(runs: QuerySet[Run]) -> list[tuple[str, int]]:
    """``(key, runs logging it)`` over ``runs``, most shared first, then by key (the column picker's list)."""
    counts = MetricSummary.objects.filter(run__in=runs).values("key").annotate(runs=Count("id"))  # a row per run+key
    return [(row["key"], row["runs"]) for row in counts.order_by("-runs", "key")]


@dataclass(frozen=True)
class Choices:
    """What the column picker offers, read from the latest ``DEFAULT_SAMPLE`` runs: every parameter name with
    whether its value varies, and every metric key with how many of those runs log it (most shared first)."""

    parameters: list[tuple[str, bool]]
    metric_keys: list[tuple[str, int]]
    sampled: int = 0

    def defaults(self) -> list[Column]:
        """The varying parameters and the last value of the ``DEFAULT_METRICS`` most shared training keys that
        at least half of the sampled runs log (the SDK's ``system/…`` keys are on offer, not shown by default)."""
        params = [f"param:{name}" for name, varies in self.parameters if varies]
        shared = [key for key, runs in self.metric_keys if 2 * runs >= self.sampled and not is_system_key(key)]
        return parse_columns(params + [f"metric:{key}:last" for key in shared[:DEFAULT_METRICS]])


def column_choices(*, runs: QuerySet[Run]) -> Choices:
    """The ``Choices`` of the column picker for ``runs`` (their latest ``DEFAULT_SAMPLE``)."""
    sample = runs.order_by("-created_at", "-id")[:DEFAULT_SAMPLE]
    values: dict[str, set] = {}
    sampled = list(sample.values_list("parameters", flat=True))
    for parameters in sampled:
        for name, value in (parameters or {}).items():
            values.setdefault(name, set()).add(repr(value))
    return Choices(
        parameters=[(name, len(values[name]) > 1) for name in sorted(values)],
        metric_keys=metric_keys_by_share(sample.values("pk")),
        sampled=len(sampled),
    )


_SUMMARY_FIELD = {"last": "last_value", "min": "min_value", "max": "max_value"}


def metric_stat(key: str, stat: str) -> Subquery:
    """The ``stat`` of metric ``key`` for the outer Run row, as a subquery (NULL when the Run lacks the key).

    Read from the Run's per-key summary: one row, whatever the Run's size (docs/design/resume.md#steps-continue)."""
    summary = MetricSummary.objects.filter(run=OuterRef("pk"), key=key)
    return Subquery(summary.values(_SUMMARY_FIELD[stat])[:1])


def _parameter(name: str):
    return KeyTransform(name, "parameters")


def with_columns(runs: QuerySet[Run], columns: list[Column]) -> QuerySet[Run]:
    """``runs`` annotated with each column's value under its ``alias``."""
    return runs.annotate(
        **{c.alias: _parameter(c.name) if c.kind == "param" else metric_stat(c.name, c.stat) for c in columns}
    )


def _value(text: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def search_filter(text: str) -> Q:
    """The ``Q`` of a search (module docstring). Raises ``ValidationFailed`` (field ``q``) naming a term that
    has no value, compares a text field with ``>``/``<``, or is empty between two ``and``."""
    query = Q()
    for term in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE) if text.strip() else []:
        match = _TERM.match(term)
        if match is None:
            if not term.strip() or re.search(r"[<>=!~]", term):
                raise ValidationFailed(
                    _("'%(term)s': write FIELD OP VALUE, e.g. lr>0.01 or status=finished") % {"term": term}, field="q"
                )
            word = term.strip().strip("\"'")
            query &= Q(name__icontains=word) | Q(external_id__icontains=word) | Q(parameters_text__icontains=word)
            continue
        field, op, raw = match.groups()
        if raw == "":
            raise ValidationFailed(_("'%(term)s': no value after '%(op)s'") % {"term": term, "op": op}, field="q")
        query &= _term(field, op, raw)
    return query


def _term(field: str, op: str, raw: str) -> Q:
    lookup = _LOOKUPS.get(op, "exact")
    if field == "tag":
        key, _sep, value = raw.partition(":")
        tag = Q(tags__key=key.strip()) & (Q(tags__value=value.strip()) if value else Q())
        if op not in ("=", "!="):
            raise ValidationFailed(
                _("tag%(op)s%(value)s: tags take = or != (tag=KEY or tag=KEY:VALUE)") % {"op": op, "value": raw},
                field="q",
            )
        return ~tag if op == "!=" else tag
    if field in _RUN_FIELDS:
        if op in (">", ">=", "<", "<="):
            raise ValidationFailed(
                _("%(field)s%(op)s%(value)s: %(field)s is text; use =, != or ~")
                % {"field": field, "op": op, "value": raw},
                field="q",
            )
        q = Q(**{f"{_RUN_FIELDS[field]}__{'iexact' if lookup == 'exact' else lookup}": str(_value(raw))})
        return ~q if op == "!=" else q
    name = field.removeprefix("params.")
    value = _value(raw)
    if op == "~":
        return Q(**{f"parameters__{name}__icontains": str(value)})
    q = Q(**{f"parameters__{name}__{lookup}": value})
    return ~q & Q(parameters__has_key=name) if op == "!=" else q


def runs_table(
    *,
    runs: QuerySet[Run],
    columns: list[Column],
    sort: str = "",
    search: str = "",
    creator: str = "",
    tag: str = "",
) -> QuerySet[Run]:
    """``runs`` filtered by ``search``, ``creator`` (username) and ``tag`` (``KEY`` or ``KEY:VALUE``), annotated
    with ``columns`` and ordered by ``sort`` (a column id or one of ``FIXED_SORTS``, ``-`` for descending;
    empty: newest first; missing values last).

    Raises ``ValidationFailed`` naming ``q`` for a bad search or ``sort`` for an unknown column.
    """
    runs = runs.alias(parameters_text=Cast("parameters", output_field=TextField()))  # in WHERE only, never selected
    if search:
        runs = runs.filter(search_filter(search))
    if creator:
        runs = runs.filter(created_by__username=creator)
    if tag:
        runs = runs.filter(_term("tag", "=", tag))
    runs = with_columns(runs.distinct() if tag or "tag" in search else runs, columns)
    if not sort:
        return runs.order_by("-created_at", "-id")
    name = sort.removeprefix("-")
    by_id = {c.id: c for c in columns}
    if name in FIXED_SORTS:
        expression = F(FIXED_SORTS[name])
    elif name in by_id and by_id[name].kind == "metric":
        # A join, not the column's subquery: ordering by a subquery runs it once per Run of the project (10,000
        # index lookups), while the join reads the key's summaries in one index range and hashes them.
        column = by_id[name]
        runs = runs.annotate(
            sort_summary=FilteredRelation("metric_summaries", condition=Q(metric_summaries__key=column.name))
        )
        expression = F(f"sort_summary__{_SUMMARY_FIELD[column.stat]}")
    elif name in by_id:
        expression = F(by_id[name].alias)
    else:
        raise ValidationFailed(_("cannot sort by '%(name)s': not a shown column") % {"name": name}, field="sort")
    ordered = expression.desc(nulls_last=True) if sort.startswith("-") else expression.asc(nulls_last=True)
    return runs.order_by(ordered, "-id")


class PageByIds:
    """``rows`` for ``Paginator``, each page read in two queries: the page's ids in the table's order, then those
    rows with every column.

    Only the id and the sort key go through the sort of a whole Project's runs (100,000 of them: the wide rows,
    their parameters and the creator's, made a metric sort three times slower), and the columns' subqueries
    run for the page's rows only (docs/design/interfaces.md#workspace).
    """

    def __init__(self, rows: QuerySet[Run]):
        self._rows = rows

    def count(self) -> int:
        return self._rows.count()

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, index: slice) -> list[Run]:
        ids = list(self._rows.values_list("pk", flat=True)[index])
        found = {run.pk: run for run in self._rows.order_by().filter(pk__in=ids)}
        return [found[pk] for pk in ids if pk in found]


def run_table_for_user(*, user, project, filters: dict, column_ids: list[str]) -> tuple[QuerySet[Run], list, Choices]:
    """The project page's table: ``(rows, columns, choices)``. ``filters`` are the cleaned ``RunFilterForm``
    (status, kind, creator, tag, q, sort); ``column_ids`` the ``col`` values, none: ``Choices.defaults``.

    Raises ``ValidationFailed`` naming ``status``, ``kind``, ``col``, ``q`` or ``sort``.
    """
    runs = run_list(user=user, project=project, status=filters.get("status"), kind=filters.get("kind"))
    choices = column_choices(runs=Run.objects.filter(project=project))
    saved = RunTableColumns.objects.filter(user=user, project=project).values_list("columns", flat=True).first()
    columns = parse_columns(column_ids or saved) if column_ids or saved else choices.defaults()
    sort = (filters.get("sort") or "").removeprefix("-")
    if sort and sort not in FIXED_SORTS and sort not in {c.id for c in columns}:
        # Sorting by a column that is not shown shows it (an unknown one is refused below, naming "sort").
        try:
            columns = parse_columns([c.id for c in columns] + [sort])
        except ValidationFailed:
            pass
    rows = runs_table(
        runs=runs,
        columns=columns,
        sort=filters.get("sort") or "",
        search=filters.get("q") or "",
        creator=filters.get("creator") or "",
        tag=filters.get("tag") or "",
    )
    return rows, columns, choices


def csv_lines(rows: QuerySet[Run], columns: list[Column]):
    """CSV text lines (header first) of ``rows``: id, name, status, kind, creator, started, then ``columns``;
    read in chunks so 10,000 runs never sit in memory at once."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(values) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(values)
        return buffer.getvalue()

    yield line(["id", "name", "status", "kind", "creator", "started_at", *(c.label for c in columns)])
    for run in rows.select_related("created_by").iterator(chunk_size=500):
        started = run.started_at.isoformat() if run.started_at else ""
        yield line(
            [
                run.external_id,
                run.name,
                run.status,
                run.kind,
                run.created_by.get_username(),
                started,
                *(_csv_cell(getattr(run, c.alias)) for c in columns),
            ]
        )


def _csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)
