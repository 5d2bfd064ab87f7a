"""``runs/search``: MLflow's filter string and ``order_by`` over mado Runs.

Supported filter clauses, joined by ``AND`` (keywords case-insensitive):

- ``params.<key>`` / ``tags.<key>`` with ``=``, ``!=``, ``LIKE``, ``ILIKE`` and a quoted string;
- ``attributes.status`` (or ``status``) with ``=``, ``!=``, ``IN (...)``, ``NOT IN (...)``;
- ``attributes.run_name`` / ``attributes.run_id`` with ``=``, ``!=``, ``LIKE``, ``ILIKE`` (run_id also ``IN``);
- ``attributes.start_time`` / ``end_time`` and ``metrics.<key>`` (latest value by step) with
  ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` and a number.

Keys may be quoted with backticks or double quotes (``params.`my key```).
Anything else answers 400 INVALID_PARAMETER_VALUE naming the clause.
``order_by`` accepts the same identifiers plus ``ASC``/``DESC``; ties are
broken by start time (newest first) then id, so pages are stable.
"""

import re
from datetime import UTC

from django.db.models import CharField, Exists, F, OuterRef, Q, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce

from mlflow_api.errors import INVALID_PARAMETER_VALUE, MlflowError
from mlflow_api.tracking.translate import FROM_MLFLOW_STATUS, KIND_TAG, RUN_NAME_TAG, mado_statuses
from runs.models import MetricPoint, RunTag

_ENTITY = {
    "params": "param",
    "param": "param",
    "parameters": "param",
    "parameter": "param",
    "tags": "tag",
    "tag": "tag",
    "metrics": "metric",
    "metric": "metric",
    "attributes": "attr",
    "attribute": "attr",
    "attr": "attr",
    "run": "attr",
}
_ATTRIBUTES = {"status", "start_time", "end_time", "run_name", "run_id", "run_uuid"}
_IDENT = r"(?:(?P<entity>[A-Za-z]+)\.)?(?P<key>`[^`]+`|\"[^\"]+\"|[\w.\-/:]+)"
_CLAUSE = re.compile(
    _IDENT
    + r"\s*(?P<op>!=|>=|<=|=|>|<|(?i:not\s+in)\b|(?i:in)\b|(?i:not\s+i?like)\b|(?i:i?like)\b)\s*"
    + r"(?P<value>'(?:[^']|'')*'|\"[^\"]*\"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\((?:[^()'\"]|'[^']*'|\"[^\"]*\")*\))"
)
_AND = re.compile(r"\s+(?i:and)\s+")
_ORDER = re.compile(_IDENT + r"(?:\s+(?P<dir>(?i:asc|desc)))?\s*$")
STRING_OPS = {"=", "!=", "like", "ilike", "not like", "not ilike"}
NUMBER_OPS = {"=": "exact", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}


def _bad(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def _unquote_key(key: str) -> str:
    return key[1:-1] if key[:1] in '`"' else key


def _ident(entity: str | None, key: str) -> tuple[str, str]:
    if entity is None:
        if key not in _ATTRIBUTES:
            raise _bad(f"unknown identifier {key!r}: use params.<key>, tags.<key>, metrics.<key> or attributes.<name>")
        return "attr", key
    kind = _ENTITY.get(entity.lower())
    if kind is None:
        # An unquoted dotted key without entity prefix, e.g. "status" never has one; refuse the rest.
        raise _bad(f"unknown entity {entity!r}: use params, tags, metrics or attributes")
    if kind == "attr" and key not in _ATTRIBUTES:
        raise _bad(f"unknown attribute {key!r}; one of {', '.join(sorted(_ATTRIBUTES))}")
    return kind, key


def string_value(raw: str) -> str:
    if raw[:1] == "'":
        return raw[1:-1].replace("''", "'")
    if raw[:1] == '"':
        return raw[1:-1]
    raise _bad(f"expected a quoted string, got {raw}")


def _strings(raw: str) -> list[str]:
    if raw[:1] != "(":
        raise _bad(f"IN expects a parenthesised list of strings, got {raw}")
    items = re.findall(r"'(?:[^']|'')*'|\"[^\"]*\"", raw)
    if not items:
        raise _bad("IN expects at least one quoted string")
    return [string_value(item) for item in items]


def number_value(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise _bad(f"expected a number, got {raw}") from None


def _like_regex(pattern: str) -> str:
    parts = []
    for char in pattern:
        parts.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
    return "^" + "".join(parts) + "$"


def string_q(field, op: str, value: str) -> Q:
    if op == "=":
        return Q(**{field: value})
    if op == "!=":
        return ~Q(**{field: value})
    lookup = "iregex" if "ilike" in op else "regex"
    q = Q(**{f"{field}__{lookup}": _like_regex(value)})
    return ~q if op.startswith("not") else q


def _latest_metric(key: str):
    points = MetricPoint.objects.filter(run=OuterRef("pk"), key=key).at_last_step().order_by("-timestamp", "-id")
    return Subquery(points.values("value")[:1])


def json_text(field: str, key: str):
    """The text under ``key`` of JSON column ``field``, for comparing with strings."""
    # Cast: compare the extracted text as plain text (SQLite would otherwise read the right side as JSON).
    return Cast(KeyTextTransform(key, field), CharField())


def _param(key: str):
    return json_text("parameters", key)


def _tag_value(key: str):
    return Subquery(RunTag.objects.filter(run=OuterRef("pk"), key=key).values("value")[:1])


def _apply_clause(runs, index: int, kind: str, key: str, op: str, raw: str):
    alias = f"_f{index}"
    if kind == "metric":
        if op not in NUMBER_OPS and op != "!=":
            raise _bad(f"metrics compare with =, !=, <, <=, >, >=; got {op}")
        runs = runs.annotate(**{alias: _latest_metric(key)})
        value = number_value(raw)
        return (
            runs.exclude(**{alias: value}).exclude(**{f"{alias}__isnull": True})
            if op == "!="
            else runs.filter(**{f"{alias}__{NUMBER_OPS[op]}": value})
        )
    if kind == "attr" and key in ("start_time", "end_time"):
        if op not in NUMBER_OPS:
            raise _bad(f"{key} compares with =, <, <=, >, >=; got {op}")
        from datetime import datetime

        moment = datetime.fromtimestamp(number_value(raw) / 1000, tz=UTC)
        column = "started_at" if key == "start_time" else "ended_at"
        return runs.filter(**{f"{column}__{NUMBER_OPS[op]}": moment})
    if kind == "attr" and key == "status":
        if op in ("in", "not in"):
            statuses = [s for name in _strings(raw) for s in mado_statuses(name)]
        elif op in ("=", "!="):
            statuses = mado_statuses(string_value(raw))
        else:
            raise _bad(f"attributes.status compares with =, !=, IN, NOT IN; got {op}")
        return (
            runs.exclude(status__in=statuses)
            if op.startswith("not") or op == "!="
            else runs.filter(status__in=statuses)
        )
    if kind == "attr" and key in ("run_id", "run_uuid") and op in ("in", "not in"):
        q = Q(external_id__in=_strings(raw))
        return runs.exclude(q) if op == "not in" else runs.filter(q)
    if op not in STRING_OPS:
        raise _bad(f"{kind} {key!r} compares with =, !=, LIKE, ILIKE; got {op}")
    value = string_value(raw)
    if kind == "attr":
        field = {"run_name": "name", "run_id": "external_id", "run_uuid": "external_id"}[key]
    elif kind == "tag" and key in (RUN_NAME_TAG, KIND_TAG):
        field = "name" if key == RUN_NAME_TAG else "kind"
    elif kind == "tag":
        if op == "!=":
            return runs.filter(Exists(RunTag.objects.filter(run=OuterRef("pk"), key=key).exclude(value=value)))
        runs, field = runs.annotate(**{alias: _tag_value(key)}), alias
    else:
        runs, field = runs.annotate(**{alias: _param(key)}), alias
        if op == "!=":
            return runs.filter(**{f"{alias}__isnull": False}).exclude(**{alias: value})
    return runs.filter(string_q(field, op, value))


def clauses(filter_string: str):
    """The clauses of an MLflow filter string joined by ``AND``: ``(index, entity or None, key, op, raw value)``.

    ``key`` is unquoted; ``op`` lower-case with single spaces (``not like``);
    the raw value is still quoted (``string_value``, ``number_value``). A
    clause that does not parse → 400 INVALID_PARAMETER_VALUE quoting it.
    """
    text = (filter_string or "").strip()
    position, index = 0, 0
    while position < len(text):
        match = _CLAUSE.match(text, position)
        if match is None:
            raise _bad(f"invalid filter at {text[position : position + 60]!r}")
        yield (
            index,
            match["entity"],
            _unquote_key(match["key"]),
            re.sub(r"\s+", " ", match["op"].lower()),
            match["value"],
        )
        position, index = match.end(), index + 1
        if position < len(text):
            joiner = _AND.match(text, position)
            if joiner is None:
                raise _bad(f"expected AND at {text[position : position + 60]!r}")
            position = joiner.end()


def apply_filter(runs, filter_string: str):
    """``runs`` narrowed by an MLflow filter string (grammar in the module docstring)."""
    for index, entity, key, op, raw in clauses(filter_string):
        kind, key = _ident(entity, key)
        runs = _apply_clause(runs, index, kind, key, op, raw)
    return runs


def apply_order(runs, order_by: list):
    """``runs`` ordered by MLflow ``order_by`` clauses, then start time (newest first) and id."""
    if not isinstance(order_by, list):
        raise _bad("order_by must be a list of strings")
    runs = runs.annotate(_start=Coalesce("started_at", "created_at"))
    ordering = []
    for index, clause in enumerate(order_by):
        match = _ORDER.match(str(clause).strip())
        if match is None:
            raise _bad(f"invalid order_by clause {clause!r}")
        kind, key = _ident(match["entity"], _unquote_key(match["key"]))
        alias = f"_o{index}"
        if kind == "metric":
            runs = runs.annotate(**{alias: _latest_metric(key)})
        elif kind == "param":
            runs = runs.annotate(**{alias: _param(key)})
        elif kind == "tag":
            runs = runs.annotate(**{alias: _tag_value(key)})
        else:
            alias = {
                "start_time": "_start",
                "end_time": "ended_at",
                "run_name": "name",
                "status": "status",
                "run_id": "external_id",
                "run_uuid": "external_id",
            }[key]
        descending = (match["dir"] or "asc").lower() == "desc"
        ordering.append(F(alias).desc(nulls_last=True) if descending else F(alias).asc(nulls_last=True))
    return runs.order_by(*ordering, F("_start").desc(), "-id")


__all__ = ["apply_filter", "apply_order", "FROM_MLFLOW_STATUS"]
