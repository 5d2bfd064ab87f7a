"""Reading the points a verdict compares: one Run's values per (key, step) in a step range
(docs/design/resume.md#parity).

Through the ``runs_metricpoint`` view, filtered on the chunks' step range too (``MetricPointQuerySet.at_steps``):
the database unnests only the chunks that reach into the range, so the cost follows the range asked for, not the
Run's size.
"""

import math

from django.db import connection

from runs.charts import SYSTEM_PREFIX
from runs.models import MetricPoint, MetricSummary

_POINTS = MetricPoint._meta.db_table
_SUMMARIES = MetricSummary._meta.db_table
_KEYS_PER_STATEMENT = 500


def latest_values(*, run_id: int, keys: list[str] | None, low: int, high: int | None) -> dict[tuple[str, int], float]:
    """``{(key, step): value}`` of Run ``run_id`` at steps ``low`` to ``high`` (both included; None: no end), of
    ``keys`` (None: every key but the system metrics, ``system/…``). At a (key, step) logged more than once the value
    stored last wins; NaN is NaN."""
    found: dict[tuple[str, int], float] = {}
    if keys is None:
        groups = [None]
    else:
        groups = [keys[i : i + _KEYS_PER_STATEMENT] for i in range(0, len(keys), _KEYS_PER_STATEMENT)]
    nan = math.nan
    for group in groups:
        sql = f"SELECT key, step, value FROM {_POINTS} WHERE run_id = %s AND step >= %s AND chunk_last_step >= %s"
        params: list = [run_id, low, low]
        if high is not None:
            sql += " AND step <= %s AND chunk_first_step <= %s"
            params += [high, high]
        if group is not None:
            sql += f" AND key IN ({', '.join(['%s'] * len(group))})"
            params += group
        else:
            sql += " AND substr(key, 1, %s) <> %s"  # the SDK's system metrics are never compared
            params += [len(SYSTEM_PREFIX), SYSTEM_PREFIX]
        with connection.cursor() as cursor:
            cursor.execute(sql + " ORDER BY id", params)
            for key, step, value in cursor.fetchall():
                found[key, step] = nan if value is None else value
    return found


def last_logged_step(*, run_id: int) -> int | None:
    """The highest step Run ``run_id`` logged a key at (from its summaries; system metrics included: they carry the
    step training logged last), or None before its first point."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT max(last_step) FROM {_SUMMARIES} WHERE run_id = %s", [run_id])
        return cursor.fetchone()[0]
