"""Metric points kept for a same-run resume after the server ended the Run ``crashed`` (SPEC F26, F37).

The server refuses points for a crashed Run (409 ``run_ended``) instead of
storing them into it. The process lost the Run but its points are real: they
are appended, one encoded point a line (the JSON list of its four field texts,
``metrics.encode_point``), to
``<run staging directory>/unsent-metrics.jsonl`` (``staging.run_staging_dir``,
the directory a same-run resume started from here looks in). The next start
of that run id (``resume="allow"|"must"|"auto"``) queues them ahead of new
points and removes the file.
"""

import json
import logging
import os
from pathlib import Path

logger = logging.getLogger("mado_tracking")

FILE_NAME = "unsent-metrics.jsonl"


def keep(directory: Path, points: list[tuple[str, str, str, str]], *, run_label: str) -> None:
    """Append ``points`` (``metrics.encode_point`` tuples) to the run's file; a write failure is logged, not raised."""
    if not points:
        return
    path = directory / FILE_NAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as spool:
            spool.write("".join(json.dumps(list(point)) + "\n" for point in points))
            spool.flush()
            os.fsync(spool.fileno())
    except OSError as exc:
        logger.error("mado: %d metric points of run %s are lost: cannot keep them in %s (%s)",
                     len(points), run_label, path, exc)
        return
    logger.warning("mado: %d metric points of run %s kept in %s; a resume of this run (its id with "
                   "resume='allow') sends them", len(points), run_label, path)


def take(directory: Path) -> list[tuple[str, str, str, str]]:
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
        if isinstance(fields, list) and len(fields) == 4 and all(isinstance(f, str) for f in fields):
            points.append(tuple(fields))
    return points
