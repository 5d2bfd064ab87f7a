"""The write lease of a Run in this process (docs/design/runs.md#one-writer-process, #states): fencing token,
heartbeats, losing the Run.

``start_run``'s answer carries a ``fencing_token``: every write for the Run
sends it in the ``Mado-Fencing-Token`` header, so the server refuses a process
that another one took over (409 ``lease_lost``). A heartbeat every
``heartbeat_interval`` seconds tells the server the process is alive; a Run
silent for longer than the server's crash timeout is marked ``crashed`` and
then answers 409 ``run_ended``. Either answer means this process has lost the
Run: one error is logged, sending stops and later ``log_metrics`` calls are
dropped. Training goes on: tracking must not kill it.
"""

import logging
import os
import re
import threading

import requests

from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError

logger = logging.getLogger("mado_tracking")

FENCING_HEADER = "Mado-Fencing-Token"
ENV_HEARTBEAT_INTERVAL = "MMT_HEARTBEAT_INTERVAL"
DEFAULT_HEARTBEAT_INTERVAL_S = 30.0
HEARTBEAT_TIMEOUT_S = 10.0
LOST_CODES = ("lease_lost", "run_ended")


def heartbeat_interval_from_environment() -> float | None:
    """``MMT_HEARTBEAT_INTERVAL`` in seconds (a float > 0), or None when unset.

    Raises ``ValueError`` naming the variable for anything else.
    """
    raw = os.environ.get(ENV_HEARTBEAT_INTERVAL, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{ENV_HEARTBEAT_INTERVAL} must be a number of seconds > 0, got {raw!r}")
    return seconds


class Lease:
    """This process's lease on one Run: its fencing token, heartbeat interval and whether it was lost.

    Shared by the caller's thread and the metric sender thread; ``lost`` only
    ever turns from False to True.
    """

    def __init__(self, *, run_label: str, token: int | None, heartbeat_interval: float):
        self.run_label = run_label
        self.token = token
        self.heartbeat_interval = heartbeat_interval
        self.lost = False
        self.ended = False  # lost because the server ended the Run (run_ended), not to another process
        self._heartbeat_failing = False
        # Reentrant: lost_by may run in a signal handler (mark_preempting) on a thread already inside it.
        self._lock = threading.RLock()

    @property
    def headers(self) -> dict:
        """The header every write for the Run carries (none when the server gave no token)."""
        return {} if self.token is None else {FENCING_HEADER: str(self.token)}

    def lost_by(self, error: ApiError) -> bool:
        """True when ``error`` says another process took the Run over or it ended on the server.

        The first such error marks the lease lost and logs one error naming
        the run; later ones only return True.
        """
        if error.status != 409 or error.code not in LOST_CODES:
            return False
        with self._lock:
            first, self.lost = not self.lost, True
            if first:
                self.ended = error.code == "run_ended"
        if first:
            logger.error(
                "mado: %s; this process stops sending metrics, heartbeats and its final status",
                self._lost_reason(error),
            )
        return True

    def _lost_reason(self, error: ApiError) -> str:
        if error.code == "lease_lost":
            holder = re.search(r" on (.+? \(pid [^)]*\))", error.detail or "")
            where = f" on {holder.group(1)}" if holder else ""
            return f"run {self.run_label} was taken over by another process{where}"
        ended = re.search(r"ended as (\w+)", error.detail or "")
        return (
            f"run {self.run_label} ended as {ended.group(1) if ended else 'a final state'} on the server "
            f"({error.detail})"
        )

    def heartbeat(self, client: ApiClient, run_id: int) -> None:
        """POST ``runs/{run_id}/heartbeat/`` once; a failure is logged (a warning, then debug until it works).

        Never raises: the next heartbeat is the retry.
        """
        path = f"runs/{run_id}/heartbeat/"
        try:
            response = client.send("POST", path, timeout=HEARTBEAT_TIMEOUT_S)
        except requests.RequestException as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code < 400:
                if self._heartbeat_failing:
                    self._heartbeat_failing = False
                    logger.warning("mado: heartbeats of run %s reach the server again", self.run_label)
                return
            error = client.error_from(response, "POST", path)
            if self.lost_by(error):
                return
            reason = str(error)
        log = logger.debug if self._heartbeat_failing else logger.warning
        self._heartbeat_failing = True
        log(
            "mado: heartbeat of run %s failed (%s); trying again in %.1f s",
            self.run_label,
            reason,
            self.heartbeat_interval,
        )
