"""Metric buffering (docs/design/resume.md#steps-continue): the caller appends to a queue, a daemon thread posts
batches.

The training loop's side is ``metric_points`` (``mado_tracking.points``: each
point checked and kept as a ``(key, value, step, timestamp)`` tuple of Python
str, float, int and float) and ``MetricSender.add`` (one ``deque.extend``, atomic
under the GIL, no lock of ours): no network and no JSON. The sender thread
turns a batch into its body with one ``orjson.dumps`` of four columns, the
only encoding of a point (its cost: docs/deploy.md, "Measured"). The sender
thread wakes every ``interval`` seconds, or as soon as
a full batch is queued, and posts batches of at most ``batch_max`` points to
``POST runs/{id}/metrics/`` in the columnar form (``{"keys", "steps",
"values", "timestamps"}``: no key name repeated per point, and checked by the
server a column at a time). When two full batches are queued (a loop
logging faster than one request at a time carries) it posts them at once,
the second from a helper thread, so the server parses one while the
database stores the other; two such batches may be stored in either order,
which only matters for a key logged twice at the same step (history and
"last value" go by step). A part batch left after a post waits for the next
wake-up (unless ``flush`` or ``close`` asks for everything), so a loop that
logs at a steady pace posts about once per ``interval`` instead of keeping a
request in flight all the time: with many writers, that queue of requests
would be the server's latency (Little's law). Each wait is ``interval`` times
a random factor in [0.5, 1.5), so processes started together (a sweep, the
ranks of a Job) do not post in step. A transient failure (server unreachable, 5xx,
408, 429) is retried with exponential backoff, keeping the batch in order
ahead of newer points; any other 4xx means the data is wrong: the batch is
dropped with a warning naming the refused field. Every batch carries its own
``Idempotency-Key`` (a uuid4, the same on each retry of that batch), so a
retry after a lost answer is a no-op on the server instead of a second copy.
``flush`` waits until what is queued has been sent (before a checkpoint);
``close`` drains the queue within a deadline.

Heartbeats have their own thread (``mado_tracking.heartbeat``), so a batch
retried through an outage of the metrics endpoint never holds them back. A
409 ``lease_lost`` / ``run_ended`` answer to either loses the Run
(``mado_tracking.lease``) and the thread ends: after ``lease_lost`` (another
process writes the Run) what is queued is dropped; after ``run_ended`` (the
server took the process for dead) it is kept for a same-run resume
(``mado_tracking.unsent``: buffered, written to disk by a thread of its own).
Points the server drops after a resume (their step is below the resumed
run's step counter) are reported with one warning per key.
"""

import logging
import math
import threading
import time
import uuid
from collections import deque

import orjson
import requests

from mado_tracking import unsent
from mado_tracking.client import JITTER, ApiClient, Backoff, is_transient, retry_after_seconds
from mado_tracking.config import Config
from mado_tracking.lease import Lease
from mado_tracking.points import Point, wire_value
from mado_tracking.threads import leave_program_signals_to_main_thread

logger = logging.getLogger("mado_tracking")

BATCH_MAX = 10_000  # docs/api.md: a metrics batch holds at most 10,000 points
FLUSH_INTERVAL_S = 1.0
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0


def batch_body(batch: list[Point]) -> bytes:
    """The columnar JSON body of ``POST runs/{id}/metrics/`` (``{"keys", "steps", "values", "timestamps"}``)."""
    keys, values, steps, stamps = zip(*batch)
    if not all(map(math.isfinite, values)):
        values = list(map(wire_value, values))
    return orjson.dumps({"keys": keys, "steps": steps, "values": values, "timestamps": stamps})


class MetricSender:
    """The queue of one Run's metric points and the daemon thread that sends them.

    Points arrive validated by ``metric_points``. Counters ``sent`` and
    ``dropped`` (refused by the server, or never sent once the Run was lost) are for reports and tests.
    ``lease`` (None: no fencing) is the Run's write lease; ``keep_dir`` (None:
    drop) is where points refused because the Run ended are kept.
    """

    def __init__(self, config: Config, run_id: int, *, lease: Lease | None = None, keep_dir=None):
        self._config = config
        self._lease = lease
        self._keep_dir = keep_dir
        self._warned_keys: set[str] = set()
        self._path = f"runs/{run_id}/metrics/"
        self._run_id = run_id
        self._batch_max = BATCH_MAX
        self._interval = FLUSH_INTERVAL_S
        self._backoff = (BACKOFF_BASE_S, BACKOFF_CAP_S)
        self._queue: deque[Point] = deque()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._everything = threading.Event()  # flush or close waits: part batches go at once too
        self._hurry = threading.Event()
        self._deadline = math.inf
        self._outage = False
        self._in_flight = 0
        self._sending = False
        self._count_lock = threading.Lock()  # ``sent`` and ``dropped`` change from two threads
        # Held from "the Run is lost" to its batch being kept: log_metrics keeps later points after them.
        self._keep_lock = threading.RLock()
        self._spool: unsent.PointSpool | None = None
        self.sent = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._loop, name=f"mado-metrics-run-{run_id}", daemon=True)
        self._thread.start()

    # --- caller side (the training loop) -----------------------------------------
    def add(self, points: list[Point]) -> None:
        """Queue ``metric_points`` points; returns at once (no I/O, no lock held)."""
        queue = self._queue
        queue.extend(points)
        if len(queue) >= self._batch_max and not self._wake.is_set():
            self._wake.set()

    @property
    def pending(self) -> int:
        """Points queued and not yet acknowledged by the server (a batch in flight is not counted)."""
        return len(self._queue)

    def flush(self, timeout: float) -> int:
        """Wait until every point queued so far is stored or refused, at most ``timeout`` seconds.

        Returns how many points are still unsent (0 when flushed). Does not
        cut a backoff short: during an outage it waits for the next retry.
        """
        deadline = time.monotonic() + max(timeout, 0.0)
        # Read the queue before the flag: the sender raises the flag before it takes a batch out.
        while self._queue or self._sending:
            if not self._thread.is_alive() or time.monotonic() >= deadline:
                return len(self._queue) + self._in_flight
            if self._queue and not self._everything.is_set():  # points logged meanwhile go at once too
                self._everything.set()
                self._wake.set()
            time.sleep(0.005)
        return 0

    def close(self, timeout: float) -> int:
        """Send everything queued, waiting at most ``timeout`` seconds; return how many points stayed unsent."""
        self._deadline = time.monotonic() + max(timeout, 0.0)
        self._closing.set()
        self._everything.set()
        self._hurry.set()
        self._wake.set()
        # A request in flight is bounded by the deadline too; the grace covers the last answer.
        self._thread.join(max(timeout, 0.0) + 2.0)
        with self._keep_lock:
            spool = self._spool
        if spool is not None:
            spool.close()
        return len(self._queue) + self._in_flight

    # --- sender thread ---------------------------------------------------------------
    def _loop(self) -> None:
        lease = self._lease
        clients = [ApiClient(self._config, headers=lease.headers if lease else None) for _ in range(2)]
        leave_program_signals_to_main_thread()
        try:
            while True:
                self._wake.wait(self._interval * JITTER.uniform(0.5, 1.5))  # writers started together drift apart
                self._wake.clear()
                if lease and lease.lost:  # the heartbeat thread lost it
                    self._drop_queue()
                    return
                if not self._drain(clients) or (lease and lease.lost):
                    return
                if self._closing.is_set() and not self._queue:
                    return
        finally:
            for client in clients:
                client.close()

    def keep(self, points: list[Point]) -> bool:
        """After the server ended the Run: keep ``points`` for a same-run resume; False when they are dropped.

        No I/O on the caller's thread: ``unsent.PointSpool`` writes them in the background (one warning per run).
        """
        with self._keep_lock:
            if self._keep_dir is None or self._lease is None or not self._lease.ended:
                return False
            if self._spool is None:
                self._spool = unsent.PointSpool(
                    self._keep_dir, run_label=self._lease.run_label, api_url=self._config.api_url
                )
            self._spool.add(points)
            return True

    def _drop_queue(self, batch: list[Point] = ()) -> None:
        points = [*batch, *self._queue]
        self._queue.clear()
        if not self.keep(points):
            self._count("dropped", len(points))

    def _count(self, counter: str, points: int) -> None:
        with self._count_lock:
            setattr(self, counter, getattr(self, counter) + points)

    def _take(self) -> list[Point]:
        queue = self._queue
        batch = []
        while queue and len(batch) < self._batch_max:
            batch.append(queue.popleft())
        return batch

    def _drain(self, clients: list[ApiClient]) -> bool:
        """Send queued batches, two at once when a second full one waits (``clients``: one per batch in flight);
        False when the close deadline passed (the unsent batches go back in front, in order)."""
        while self._queue:
            self._sending = True
            batches = [self._take()]
            if len(self._queue) >= self._batch_max:
                batches.append(self._take())
            self._in_flight = sum(map(len, batches))
            delivered = [False] * len(batches)
            helper = None
            if len(batches) == 2:  # the helper inherits this thread's blocked PROGRAM_SIGNALS
                helper = threading.Thread(
                    target=self._send_into,
                    args=(clients[1], batches[1], delivered, 1),
                    name=f"mado-metrics-run-{self._run_id}-2",
                    daemon=True,
                )
                helper.start()
            self._send_into(clients[0], batches[0], delivered, 0)
            if helper is not None:
                helper.join()
            for batch, sent in reversed(list(zip(batches, delivered))):
                if not sent:
                    self._queue.extendleft(reversed(batch))
            self._in_flight = 0
            self._sending = False
            if not all(delivered):
                return False
            if len(self._queue) < self._batch_max and not (self._everything.is_set() or self._closing.is_set()):
                return True  # a part batch waits for the next wake-up
        self._everything.clear()
        return True

    def _send_into(self, client: ApiClient, batch: list[tuple], delivered: list[bool], index: int) -> None:
        """``delivered[index] = self._send(client, batch)``; an unexpected error drops the batch, logged."""
        try:
            delivered[index] = self._send(client, batch)
        except Exception:  # a bug of ours must not kill the thread silently
            logger.exception(
                "mado: dropped %d metric points of run %s after an unexpected error", len(batch), self._run_id
            )
            self._count("dropped", len(batch))
            delivered[index] = True

    def _send(self, client: ApiClient, batch: list[Point]) -> bool:
        """Post one batch until it is stored or refused; False when the close deadline ran out first."""
        body = batch_body(batch)
        headers = {"Idempotency-Key": str(uuid.uuid4())}  # the same key on every retry of this batch
        backoff = Backoff(*self._backoff)
        while True:
            remaining = None
            if self._closing.is_set():
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    return False
            try:
                response = client.send("POST", self._path, raw=body, timeout=remaining, headers=headers)
            except requests.RequestException as exc:
                reason, delay = f"{type(exc).__name__}: {exc}", backoff.next_delay()
            else:
                if response.status_code < 400:
                    self._recovered()
                    self._count("sent", len(batch))
                    self._warn_dropped_keys(response)
                    return True
                if not is_transient(response.status_code):
                    self._refused(client, response, batch)
                    return True
                reason = f"HTTP {response.status_code}"
                delay = backoff.next_delay(retry_after_seconds(response))
            self._failed(reason, delay)
            if self._closing.is_set():
                delay = min(delay, max(self._deadline - time.monotonic(), 0.0))
            if self._hurry.wait(delay):
                self._hurry.clear()

    def _failed(self, reason: str, delay: float) -> None:
        log = logger.debug if self._outage else logger.warning
        self._outage = True
        log(
            "mado: cannot send metrics of run %s (%s); retrying in %.1f s, %d points buffered",
            self._run_id,
            reason,
            delay,
            len(self._queue),
        )

    def _recovered(self) -> None:
        if self._outage:
            self._outage = False
            logger.warning("mado: sending metrics of run %s again", self._run_id)

    def _warn_dropped_keys(self, response: requests.Response) -> None:
        try:
            keys = response.json().get("dropped_keys") or []
        except (ValueError, AttributeError):
            return
        for key in keys:
            if key not in self._warned_keys:
                self._warned_keys.add(key)
                logger.warning(
                    "mado: points of %r were dropped by the server: their step is below the step run %s "
                    "continues at after its resume (run.step; log_metrics without step= counts from it)",
                    key,
                    self._lease.run_label if self._lease is not None else self._run_id,
                )

    def _refused(self, client: ApiClient, response: requests.Response, batch: list[tuple]) -> None:
        error = client.error_from(response, "POST", self._path)
        with self._keep_lock:  # a log_metrics that sees the Run lost keeps its points after this batch
            if self._lease is not None and self._lease.lost_by(error):
                self._drop_queue(batch)
                return
        count = len(batch)
        self._count("dropped", count)
        logger.warning(
            "mado: the server refused a batch of %d metric points of run %s (field %s: %s); the batch is dropped",
            count,
            self._run_id,
            error.field or "unknown",
            error.detail,
        )
