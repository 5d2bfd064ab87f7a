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

The training thread never writes that file: ``PointSpool.add`` only appends to
a list (one warning per run, at the first point kept), and a daemon thread
appends what gathered to the file with one ``fsync`` about once a second;
``close`` (``run.finish()``, also at interpreter exit) writes the rest. A
process killed outright loses at most the last second's points.

The directory is keyed by the server's identity, not the URL's text
(``staging.run_staging_dir``). ``take_for_run`` also takes what an SDK that
keyed by the text left, and names, with a warning, points kept for the same
project and run id under another server, which it leaves alone (they may
belong to another server's run of that id).
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import threading
from pathlib import Path

from mado_tracking.points import Point, metric_points, wire_value
from mado_tracking.staging import cache_root, earlier_run_staging_dir, run_staging_dir
from mado_tracking.threads import leave_program_signals_to_main_thread

logger = logging.getLogger("mado_tracking")

FILE_NAME = "unsent-metrics.jsonl"
SERVER_FILE = "server.json"
FLUSH_INTERVAL_S = 1.0


def keep(directory: Path, points: list[Point], *, run_label: str) -> bool:
    """Append ``points`` (``metric_points`` tuples) to the run's file and ``fsync`` it; True when written.

    A write failure is logged as an error naming the count and the file, not raised.
    """
    if not points:
        return True
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
        return False
    return True


class PointSpool:
    """The points of one lost Run kept for its resume, written by a daemon thread (see the module docstring).

    ``add`` is what ``log_metrics`` calls (a lock and a list extend); the
    thread writes at most once per ``interval`` seconds; ``close`` writes the
    rest and stops it. ``api_url`` is recorded beside the file so a resume
    under another server key can name it.
    """

    def __init__(self, directory: Path, *, run_label: str, api_url: str = "", interval: float = FLUSH_INTERVAL_S):
        self.directory = directory
        self._label = run_label
        self._api_url = api_url
        self._interval = interval
        self._buffer: list[Point] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.kept = 0

    def add(self, points: list[Point]) -> None:
        """Keep ``points`` (after those added before); the first call starts the writer and warns once."""
        with self._lock:
            self._buffer.extend(points)
            self.kept += len(points)
            if self._thread is not None or self._closed.is_set():
                return
            self._thread = threading.Thread(target=self._loop, name=f"mado-keep-{self._label}", daemon=True)
            self._thread.start()
        logger.warning(
            "mado: run %s ended on the server; its metric points are kept in %s from now on and sent by a resume "
            "of this run (its id with resume='allow')",
            self._label,
            self.directory / FILE_NAME,
        )

    def flush(self) -> None:
        """Write what gathered (one append and one ``fsync``)."""
        with self._write_lock:
            with self._lock:
                points, self._buffer = self._buffer, []
            if points:
                record_server(self.directory, self._api_url)
                keep(self.directory, points, run_label=self._label)

    def close(self) -> None:
        """Stop the writer and write the rest; later ``add`` calls are written by ``close`` again."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def _loop(self) -> None:
        leave_program_signals_to_main_thread()
        while not self._closed.wait(self._interval):
            self.flush()


def record_server(directory: Path, api_url: str) -> None:
    """Write ``<cache>/staging/<server key>/server.json`` (``{"api_url"}``) once; a failure is ignored."""
    if not api_url:
        return
    path = directory.parents[1] / SERVER_FILE
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"api_url": api_url}) + "\n", encoding="utf-8")
    except OSError:
        pass


def take_for_run(*, api_url: str, project: str, external_id: str) -> list[Point]:
    """The points kept for this run on this server (oldest first), removing their files; warns about others.

    Reads ``staging.run_staging_dir`` and the directory SDKs that keyed by
    the URL's text used. Points kept for the same ``project`` and
    ``external_id`` under another server key are left where they are, with
    one warning naming the file and the API URL they were kept for.
    """
    own = run_staging_dir(api_url=api_url, project=project, external_id=external_id)
    earlier = earlier_run_staging_dir(api_url=api_url, project=project, external_id=external_id)
    points = take(own) + (take(earlier) if earlier is not None else [])
    servers = cache_root() / "staging"
    try:
        others = [
            path
            for path in servers.glob(f"*/{glob.escape(project)}/{glob.escape(external_id)}/{FILE_NAME}")
            if path.parent not in (own, earlier)
        ]
    except OSError:
        others = []
    for path in others:
        try:
            kept_for = json.loads((path.parents[2] / SERVER_FILE).read_text(encoding="utf-8"))["api_url"]
        except (OSError, ValueError, KeyError, TypeError):
            kept_for = "another server address"
        logger.warning(
            "mado: %s holds metric points of run %s kept for %s, not %s; they are not sent. If that is this "
            "server, start this run once with MMT_API_URL=%s (or move the file to %s) to send them",
            path,
            external_id,
            kept_for,
            api_url,
            kept_for,
            own,
        )
    return points


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
