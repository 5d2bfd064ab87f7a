"""Prometheus metrics of mado, through the maintained client library (``prometheus_client``;
docs/deploy.md#health-and-metrics).

Counted where it happens, in the process it happens in:

- ``mado_http_request_duration_seconds{view,method,status}`` (histogram): every request of a web process, by
  the URL pattern's name (``RequestMetricsMiddleware``);
- ``mado_metric_points_ingested_total``: metric points stored (the ``runs.hooks.metrics_stored`` event);
- ``mado_checkpoint_verification_seconds{outcome}`` (histogram) and ``mado_checkpoint_verified_bytes_total``: the
  worker's verification of checkpoints uploaded straight to S3 (Celery's task signals);
- ``mado_reaper_actions_total{task}``: what each periodic check ended, released or sent (its return value).

Read from the database and the broker at each scrape (``StateCollector``), so any web process answers for all:
``mado_jobs{queue,state}``, ``mado_queue_depth{queue}`` (messages waiting in the broker; absent while it is
down), ``mado_outbox_backlog{state}`` (``unsent``: the broker has not taken them; ``unclaimed``: sent, and their work
still waits for a worker; ``mado.outbox.dispatch_backlog``).

A web server of several processes (gunicorn) shares its counters through ``PROMETHEUS_MULTIPROC_DIR`` (the
image's ``web`` sub-command sets and empties it at start); a worker serves its own on ``MADO_METRICS_PORT``.
"""

import logging
import os
import time

from django.conf import settings
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)

REQUEST_SECONDS = Histogram(
    "mado_http_request_duration_seconds",
    "Time to answer a request, by URL pattern name, method and status class",
    ["view", "method", "status"],
)
POINTS_INGESTED = Counter("mado_metric_points_ingested_total", "Metric points stored")
VERIFY_SECONDS = Histogram(
    "mado_checkpoint_verification_seconds",
    "Time to verify a checkpoint uploaded straight to the storage, by outcome",
    ["outcome"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
VERIFIED_BYTES = Counter("mado_checkpoint_verified_bytes_total", "Bytes of checkpoint tars verified")
REAPER_ACTIONS = Counter("mado_reaper_actions_total", "Rows a periodic check ended, released or sent", ["task"])
VERIFY_TASK = "worker.tasks.checkpoint_verify"


class RequestMetricsMiddleware:
    """Time each request (from here inwards) into ``mado_http_request_duration_seconds``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        view = (match.view_name or match._func_path) if match else "unmatched"
        REQUEST_SECONDS.labels(view, request.method, f"{response.status_code // 100}xx").observe(
            time.perf_counter() - started
        )
        return response


class StateCollector:
    """Gauges read at scrape time: Jobs by queue and state, the broker's queue depths, the outbox's backlog."""

    def collect(self):
        from django.db.models import Count

        from jobs.models import Job, Queue
        from mado.outbox import broker_call, dispatch_backlog

        jobs = GaugeMetricFamily("mado_jobs", "Jobs by queue and state", labels=["queue", "state"])
        for row in Job.objects.values("queue__name", "status").annotate(n=Count("id")).order_by():
            jobs.add_metric([row["queue__name"], row["status"]], row["n"])
        yield jobs
        backlog = GaugeMetricFamily("mado_outbox_backlog", "Outbox messages waiting", labels=["state"])
        for state, count in dispatch_backlog().items():
            backlog.add_metric([state], count)
        yield backlog
        names = set(Queue.objects.values_list("name", flat=True)) | {settings.CELERY_TASK_DEFAULT_QUEUE}
        depth = GaugeMetricFamily("mado_queue_depth", "Messages waiting in the broker, by queue", labels=["queue"])
        try:  # a broker that accepts connections but never answers holds the scrape no longer than /readyz
            found = broker_call(lambda: queue_depths(sorted(names)), timeout=settings.MADO_READYZ_TIMEOUT_S)
            for name, count in found.items():
                depth.add_metric([name], count)
        except Exception as exc:  # noqa: BLE001 - the broker's outage shows as missing samples and in /readyz
            logger.warning("queue depth unavailable: %s", exc)
        yield depth


def queue_depths(names: list[str]) -> dict[str, int]:
    """``{queue: messages waiting}`` as the broker reports them (0 for a queue it does not hold); raises the
    broker's connection error when it cannot be reached within ``MADO_READYZ_TIMEOUT_S`` (a broker that connects
    but never answers: the caller bounds the whole, ``mado.outbox.broker_call``)."""
    from kombu.exceptions import ChannelError

    from config.celery import app

    found = {}
    with app.connection_for_read() as conn:
        conn.ensure_connection(max_retries=0, timeout=settings.MADO_READYZ_TIMEOUT_S)
        channel = conn.default_channel
        for name in names:
            try:
                found[name] = channel.queue_declare(queue=name, passive=True).message_count
            except ChannelError:  # never declared: nothing waits in it
                found[name] = 0
                channel = conn.channel()
    return found


class _ThisProcess:
    """The counters of this process (the client library's default registry)."""

    def collect(self):
        yield from REGISTRY.collect()


_state = StateCollector()


def exposition() -> tuple[bytes, str]:
    """This process's metrics (all processes' when ``PROMETHEUS_MULTIPROC_DIR`` is set) and the state gauges, in
    the Prometheus text format; returns ``(body, content type)``."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(_state)
    return generate_latest(registry), CONTENT_TYPE_LATEST


# --- receivers, connected by config.apps -------------------------------------------------------------------------


def count_points(sender, *, batch=None, **kwargs) -> None:
    """``runs.hooks.metrics_stored``: add the batch's points (``batch.counts``: points per key)."""
    if batch is not None:
        POINTS_INGESTED.inc(int(batch.counts.sum()))


_verify_started: dict[str, float] = {}


def task_started(sender=None, task_id=None, **kwargs) -> None:
    if sender is not None and sender.name == VERIFY_TASK:
        _verify_started[task_id] = time.perf_counter()


def task_ended(sender=None, task_id=None, args=None, retval=None, state=None, **kwargs) -> None:
    """Celery's ``task_postrun``: time a verification (and count its bytes), count a periodic check's actions."""
    if sender is None:
        return
    if sender.name == VERIFY_TASK and task_id in _verify_started:
        elapsed = time.perf_counter() - _verify_started.pop(task_id)
        outcome = retval if state == "SUCCESS" and isinstance(retval, str) else "error"
        VERIFY_SECONDS.labels(outcome).observe(elapsed)
        if outcome == "complete" and args:
            from checkpoints.models import Checkpoint

            size = Checkpoint.objects.filter(pk=args[0]).values_list("tar_size", flat=True).first()
            VERIFIED_BYTES.inc(size or 0)
    elif sender.name in _periodic_tasks() and isinstance(retval, int) and state == "SUCCESS":
        REAPER_ACTIONS.labels(sender.name).inc(retval)


def _periodic_tasks() -> set[str]:
    from mado.periodic import SCHEDULE

    return {entry["task"] for entry in SCHEDULE.values()}


def serve_worker_metrics(sender=None, **kwargs) -> None:
    """Celery's ``worker_ready``: serve this worker's metrics on ``MADO_METRICS_PORT`` (0: not served)."""
    if settings.MADO_METRICS_PORT:
        from prometheus_client import start_http_server

        start_http_server(settings.MADO_METRICS_PORT)
        logger.info("worker metrics on port %d", settings.MADO_METRICS_PORT)
