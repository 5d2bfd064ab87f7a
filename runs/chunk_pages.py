"""A page of one key's points by (step, id), cut from the chunks it spans on PostgreSQL
(docs/design/resume.md#steps-continue).

``PAGE_CTE`` finds the key's chunks (``MetricChunk``) in index order
``(last_step, id)`` with the count of points before each, then unnests only
the slices of the chunks the page ``[offset, end)`` spans, as ``page``
(``before``, ``n``: the order; ``step``, ``value`` with NaN as NaN,
``"timestamp"``). That order is the points' (step, id) order when no chunk
starts below the step where the one before it ends (a tie only after it,
whose ids are higher): what a training loop logging in step order leaves.
``ORDERED`` says whether that held; when it did not, the caller reads the
page through the ``runs_metricpoint`` view instead, sorted (it grows with
the key). The cost otherwise grows with the page and the number of chunks
before it, not with their points. Parameters: ``run``, ``key``,
``offset``, ``end`` (``offset + limit``).
"""

from django.db import connection

from runs.models import MetricChunk

_CHUNKS = MetricChunk._meta.db_table
_SLICE = "[greatest(%(offset)s - s.before, 0) + 1 : least(%(end)s - s.before, s.count)]"
PAGE_CTE = f"""
WITH spans AS (
    SELECT id, first_step, count, sum(count) OVER w - count AS before,
           lag(last_step) OVER w AS prev_last, lag(id) OVER w AS prev_id
    FROM {_CHUNKS} WHERE run_id = %(run)s AND key = %(key)s
    WINDOW w AS (ORDER BY last_step, id ROWS UNBOUNDED PRECEDING)
), page AS (
    SELECT s.before, p.n, p.step, p.value, p."timestamp"
    FROM spans s JOIN {_CHUNKS} c ON c.run_id = %(run)s AND c.id = s.id  -- run: one partition
    CROSS JOIN LATERAL unnest(c.steps{_SLICE}, c."values"{_SLICE}, c.timestamps{_SLICE})
        WITH ORDINALITY AS p(step, value, "timestamp", n)
    WHERE s.before < %(end)s AND s.before + s.count > %(offset)s
)
"""
ORDERED = """(SELECT coalesce(bool_and(prev_last IS NULL OR prev_last < first_step
                                   OR (prev_last = first_step AND prev_id < id)), true) FROM spans)"""
_ROWS = f"""{PAGE_CTE}
SELECT {ORDERED}, step, NULLIF(value, 'NaN'::float8), "timestamp" FROM page ORDER BY before, n
"""


def page_params(*, run_id: int, key: str, offset: int, limit: int) -> dict:
    """The parameters of ``PAGE_CTE`` for ``limit`` points after skipping ``offset`` (counts of points)."""
    return {"run": run_id, "key": key, "offset": offset, "limit": limit, "end": offset + limit}


def chunk_page_rows(*, run_id: int, key: str, offset: int, limit: int) -> list[tuple] | None:
    """``(step, value or None for NaN, timestamp_ms)`` of the page, or None when the key's chunks overlap
    (read it through the view). PostgreSQL only."""
    with connection.cursor() as cursor:
        cursor.execute(_ROWS, page_params(run_id=run_id, key=key, offset=offset, limit=limit))
        rows = cursor.fetchall()
    if rows and not rows[0][0]:
        return None
    return [row[1:] for row in rows]
