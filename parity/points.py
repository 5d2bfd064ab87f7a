"""Reading the points a verdict compares: one Run's values per (key, step) in a step range
(docs/design/resume.md#parity).

Through the ``runs_metricpoint`` view, filtered on the chunks' step range too (``MetricPointQuerySet.at_steps``):
the database unnests only the chunks that reach into the range, so the cost follows the range asked for, not the
Run's size.
"""

import numpy as np
from django.db import connection

from parity.compare import Series
from runs.charts import SYSTEM_PREFIX
from runs.models import MetricPoint, MetricSummary

_POINTS = MetricPoint._meta.db_table
_SUMMARIES = MetricSummary._meta.db_table
_KEYS_PER_STATEMENT = 500


def latest_values(*, run_id: int, keys: list[str] | None, low: int, high: int | None) -> dict[str, Series]:
    """``{key: (steps, values)}`` of Run ``run_id`` at steps ``low`` to ``high`` (both included; None: no end), of
    ``keys`` (None: every key but the system metrics, ``system/…``): steps int64, increasing and distinct, values
    float64 (NaN as NaN). At a step logged more than once the value stored last counts."""
    found: dict[str, Series] = {}
    if keys is None:
        groups = [None]
    else:
        groups = [keys[i : i + _KEYS_PER_STATEMENT] for i in range(0, len(keys), _KEYS_PER_STATEMENT)]
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
            cursor.execute(sql + " ORDER BY key, step, id", params)
            rows = cursor.fetchall()
        if not rows:
            continue
        names, steps, values = zip(*rows)
        names = np.array(names, dtype=object)
        steps = np.array(steps, dtype=np.int64)
        values = np.array(values, dtype=np.float64)  # NULL (NaN) becomes nan
        bounds = np.r_[0, np.flatnonzero(names[1:] != names[:-1]) + 1, len(names)].tolist()
        for start, stop in zip(bounds, bounds[1:]):
            key_steps = steps[start:stop]
            last = np.r_[key_steps[1:] != key_steps[:-1], True]  # the last of each step's points, in storing order
            found[names[start]] = (key_steps[last], values[start:stop][last])
    return found


def last_logged_step(*, run_id: int) -> int | None:
    """The highest step Run ``run_id`` logged a key at (from its summaries; system metrics included: they carry the
    step training logged last), or None before its first point."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT max(last_step) FROM {_SUMMARIES} WHERE run_id = %s", [run_id])
        return cursor.fetchone()[0]
