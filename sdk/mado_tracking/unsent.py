"""Metric points kept for a same-run resume after the server ended the Run ``crashed``
(docs/design/runs.md#states, #liveness).

The server refuses points for a crashed Run (409 ``run_ended``) instead of
storing them into it. The process lost the Run but its points are real: they
are appended, one point a line (the JSON list ``[key, value, step, timestamp]``,
a value that is not finite as ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``), to
``<run staging directory>/unsent-metrics.jsonl`` (``staging.run_staging_dir``,
the directory a same-run resume started from here looks in). The next start
of that run id (``resume="allow"|"must"|"auto"``) queues them ahead of new
points and removes the file.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from mado_tracking.points import Point, metric_points, wire_value

logger = logging.getLogger("mado_tracking")

FILE_NAME = "unsent-metrics.jsonl"


def keep(directory: Path, points: list[Point], *, run_label: str) -> None:
    """Append ``points`` (``metric_points`` tuples) to the run's file; a write failure is logged, not raised."""
    if not points:
        return
    path = directory / FILE_NAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as spool:
            spool.write(
                "".join(json.dumps([key, wire_value(value), step, stamp]) + "\n" for key, value, step, stamp in points)
            )
            spool.flush()
            os.fsync(spool.fileno())
    except OSError as exc:
        logger.error(
            "mado: %d metric points of run %s are lost: cannot keep them in %s (%s)", len(points), run_label, path, exc
        )
        return
    logger.warning(
        "mado: %d metric points of run %s kept in %s; a resume of this run (its id with resume='allow') sends them",
        len(points),
        run_label,
        path,
    )


def take(directory: Path) -> list[Point]:
    """The points kept for this run (oldest first), removing the file; [] when there is none."""
    path = directory / FILE_NAME
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        logger.warning("mado: cannot read kept metric points in %s (%s); they stay there", path, exc)
        return []
    path.unlink(missing_ok=True)
    points = []
    for line in lines:
        try:
            fields = json.loads(line)
        except ValueError:
            continue  # the cut last line a killed process may leave
        point = _point(fields)
        if point is not None:
            points.append(point)
    return points


def _point(fields) -> Point | None:
    """A kept line's point, checked as ``log_metrics`` checks one; None for a line that is not a valid point.

    Lines written by earlier SDKs hold the four fields' JSON texts
    (``["\\"loss\\"", "0.5", "3", "1700000000.5"]``).
    """
    if not isinstance(fields, list) or len(fields) != 4:
        return None
    try:
        if all(isinstance(field, str) for field in fields):
            fields = [json.loads(field) for field in fields]
        key, value, step, stamp = fields
        if isinstance(value, str):
            value = _NON_FINITE[value]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not 0 <= stamp < _STAMP_MAX:
            return None
        point = metric_points({key: value}, step, float(stamp))[0]
    except (ValueError, TypeError, KeyError, OverflowError):
        return None
    return point


_STAMP_MAX = 9.2e15  # Unix seconds whose milliseconds still fit the server's BIGINT
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
