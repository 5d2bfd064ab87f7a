"""One page of a metric's history as JSON text, the hot read path (100,000 points in ≤ 0.3 s;
docs/design/resume.md#steps-continue).

The page is ``[{"step": int, "value": number | "NaN" | "Infinity" | "-Infinity",
"timestamp": Unix seconds}, …]`` ordered by step, then insertion. On
PostgreSQL the text is built by the database in one ``string_agg`` (its
``float8`` text output is the shortest exact form, valid JSON for finite
values), so Python never touches the 100,000 rows, and only the chunks
(``MetricChunk``) holding the page are unnested. Elsewhere (SQLite, whose
REAL-to-text keeps only 15 digits) the rows are formatted here with ``repr``,
which round-trips exactly.
"""

import json
import math

from django.db import connection

from runs import selectors
from runs.chunk_pages import ORDERED, PAGE_CTE, page_params
from runs.models import MetricPoint, Run

_NON_FINITE = {math.inf: '"Infinity"', -math.inf: '"-Infinity"'}
_NAN = '"NaN"'
_JSON_POINT = f"""
    '{{"step":' || step || ',"value":' ||
    CASE WHEN value IS NULL OR value = 'NaN'::float8 THEN '{_NAN}'
         WHEN value = 'Infinity'::float8 THEN '"Infinity"'
         WHEN value = '-Infinity'::float8 THEN '"-Infinity"'
         ELSE value::text END ||
    ',"timestamp":' || ("timestamp"::float8 / 1000)::text || '}}'
"""
_PG_PAGE = f"""{PAGE_CTE}
SELECT {ORDERED} AS ordered, '[' || coalesce(string_agg({_JSON_POINT}, ',' ORDER BY before, n), '') || ']' FROM page
"""
_PG_VIEW_PAGE = f"""
SELECT '[' || coalesce(string_agg({_JSON_POINT}, ',' ORDER BY step, id), '') || ']'
FROM (SELECT id, step, value, "timestamp" FROM {MetricPoint._meta.db_table}
      WHERE run_id = %(run)s AND key = %(key)s ORDER BY step, id LIMIT %(limit)s OFFSET %(offset)s) AS page
"""


def metric_history_json(*, run: Run, key: str, offset: int, limit: int) -> str:
    """The JSON array text of ``limit`` points of ``key`` in ``run`` after skipping ``offset`` (both counts).

    On PostgreSQL a key logged in step order (each batch at or after the
    last step of the one before: what training loops do) is read as slices
    of the chunks the page spans (``runs.chunk_pages``); a key logged out of
    order is sorted whole through the view.
    """
    if connection.vendor == "postgresql":
        params = page_params(run_id=run.pk, key=key, offset=offset, limit=limit)
        with connection.cursor() as cursor:
            cursor.execute(_PG_PAGE, params)
            ordered, text = cursor.fetchone()
            if ordered:
                return text
            cursor.execute(_PG_VIEW_PAGE, params)
            return cursor.fetchone()[0]
    return _rows_json(selectors.metric_history(run=run, key=key, offset=offset, limit=limit))


SHAPES = ("points", "columns")


def metric_history_downsampled_json(
    *, run: Run, key: str, max_points: int, shape: str = "columns"
) -> tuple[str, int, int]:
    """At most ``max_points`` (>= 2) points of ``key`` as JSON text, reduced in SQL; with the counts.

    Returns ``(text, non_finite, total)``. Up to ``max_points`` finite points
    come back whole; above, the step range is cut into at most
    ``max_points // 2`` buckets and each keeps its smallest and its largest
    value (``selectors.metric_chart_series``), so spikes survive. NaN and
    ±Infinity are counted in ``non_finite``, never returned (docs/design/resume.md#steps-continue;
    docs/design/interfaces.md#workspace). ``shape`` "columns" (the API's default) gives one object of three arrays of
    one length, ``{"steps": [int], "values": [number], "timestamps": [Unix seconds]}`` (less than half the bytes: no
    field names per point); "points" the history pages' array of ``{step, value, timestamp}`` objects.
    """
    rows, non_finite, total = selectors.metric_chart_series(
        run=run, key=key, max_points=max_points, with_timestamps=True
    )
    if shape == "columns":
        return _columns_json(rows), non_finite, total
    return _rows_json(rows), non_finite, total


def _columns_json(rows) -> str:
    """Finite ``(step, value, timestamp_ms)`` rows as ``{"steps", "values", "timestamps"}`` JSON text."""
    steps, values, stamps = zip(*rows) if rows else ((), (), ())
    return json.dumps(
        {"steps": steps, "values": values, "timestamps": [ts / 1000 for ts in stamps]}, separators=(",", ":")
    )


def _rows_json(rows) -> str:
    """``(step, value, timestamp_ms)`` rows as the JSON array text of the history API (``repr``: exact floats)."""
    isfinite = math.isfinite
    return (
        "["
        + ",".join(
            [
                f'{{"step":{step},"value":'
                f'{repr(value) if isfinite(value) else _NON_FINITE.get(value, _NAN)},"timestamp":{ts / 1000!r}}}'
                for step, value, ts in rows
            ]
        )
        + "]"
    )
