"""Heartbeats of a Run on their own daemon thread (docs/design/runs.md#states, #liveness).

The metric sender may spend minutes retrying one batch while the metrics
endpoint answers 503 (``MMT_RETRY_TIMEOUT``); the heartbeat must still get
through, or a live process is reaped as ``crashed``. So heartbeats have their
own thread and their own HTTP session: one ``POST runs/{id}/heartbeat/`` every
``lease.heartbeat_interval`` seconds at most, single attempt (the next beat is
the retry, ``Lease.heartbeat``). Each wait is 80-100 % of the interval
(``client.jittered``), never longer, so the server's crash timeout keeps its
margin, and Runs started in the same second do not beat in step for as long
as they run: beats arriving together hold up the metrics POSTs in flight
(docs/deploy.md, "Measured: the ingest benchmark's writers"). A 409 ``lease_lost`` / ``run_ended``
answer marks the lease lost and the thread ends; the metric sender sees
``lease.lost``.
"""

import threading

from mado_tracking.client import ApiClient, jittered
from mado_tracking.config import Config
from mado_tracking.lease import HEARTBEAT_TIMEOUT_S, Lease
from mado_tracking.threads import leave_program_signals_to_main_thread


class Heartbeat:
    """The thread that beats for Run ``run_id`` until ``close`` or until the lease is lost."""

    def __init__(self, config: Config, run_id: int, *, lease: Lease):
        self._config = config
        self._run_id = run_id
        self._lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"mado-heartbeat-run-{run_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop beating; waits for a beat in flight (at most its request timeout), so none arrives after this."""
        self._stop.set()
        self._thread.join(HEARTBEAT_TIMEOUT_S + 1.0)

    def _loop(self) -> None:
        leave_program_signals_to_main_thread()
        client = ApiClient(self._config, headers=self._lease.headers)
        try:
            while not self._stop.wait(jittered(self._lease.heartbeat_interval)) and not self._lease.lost:
                self._lease.heartbeat(client, self._run_id)
        finally:
            client.close()
