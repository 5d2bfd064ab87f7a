"""What the people who run mado ask of a web process: is it alive, can it serve, what is it doing
(docs/deploy.md#health-and-metrics).

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the process answers; it asks no other service (a
  liveness probe that restarts a web process because the database is down only adds restarts to the outage).
- ``GET /readyz``: 200 ``{"status": "ready", "components": {...}}`` when the database, the broker and the artifact
  storage answer within ``MADO_READYZ_TIMEOUT_S`` seconds each (checked at once, in threads); otherwise 503
  ``{"status": "unavailable", "components": {"database": "ok", "broker": "<why>", ...}}`` naming each component
  that failed and why, for a load balancer or a readiness probe.
- ``GET /metrics``: the Prometheus text format (``config.metrics``), for a caller that sends
  ``Authorization: Bearer <MADO_METRICS_TOKEN>`` or whose address is in ``MADO_METRICS_ALLOW_FROM`` (networks,
  default loopback only); anyone else gets 403 JSON saying so.

``OperatorEndpointsMiddleware`` answers these three paths before any other middleware: a probe sends the pod's
address as its Host (not in ``ALLOWED_HOSTS``) over plain HTTP (which ``MADO_SECURE_SSL_REDIRECT`` would
redirect), and neither may fail a probe. The URL patterns in ``config.urls`` name the same views.
"""

import ipaddress
import secrets
from concurrent.futures import ThreadPoolExecutor, wait

from django.conf import settings
from django.core.files.storage import storages
from django.db import connection
from django.http import HttpResponse, JsonResponse

from config import metrics
from config.celery import app as celery_app

READINESS_PROBE_KEY = ".mado-readyz"  # asked for, never written: its absence is the expected answer
# Room for a few probes whose checks hang (a service that never answers) without queueing the next ones.
_checks_pool = ThreadPoolExecutor(max_workers=12, thread_name_prefix="readyz")


def _database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()  # this pool thread's own connection: a probe every few seconds keeps none open


def _broker() -> None:
    with celery_app.connection_for_read() as conn:
        conn.ensure_connection(max_retries=0, timeout=settings.MADO_READYZ_TIMEOUT_S)


def _storage() -> None:
    storages["artifacts"].exists(READINESS_PROBE_KEY)


CHECKS = {"database": _database, "broker": _broker, "storage": _storage}


def readiness() -> dict[str, str]:
    """``{component: "ok" | why it failed}`` for the database, the broker and the artifact storage.

    Each check runs in a thread of its own, all at once, and one that has not answered within
    ``MADO_READYZ_TIMEOUT_S`` seconds counts as failed ("no answer within N s"); never raises.
    """
    futures = {name: _checks_pool.submit(check) for name, check in CHECKS.items()}
    wait(futures.values(), timeout=settings.MADO_READYZ_TIMEOUT_S)  # one deadline for the three
    found = {}
    for name, future in futures.items():
        if not future.done():
            found[name] = f"no answer within {settings.MADO_READYZ_TIMEOUT_S} s"
        elif future.exception() is not None:
            exc = future.exception()
            found[name] = f"{type(exc).__name__}: {exc}"[:300]
        else:
            found[name] = "ok"
    return found


def healthz(request) -> JsonResponse:
    """200 ``{"status": "ok"}``: the process answers (docs/deploy.md#health-and-metrics). Any method, no login."""
    return JsonResponse({"status": "ok"})


def readyz(request) -> JsonResponse:
    """200 when the database, the broker and the storage answer, else 503 naming each that does not
    (docs/deploy.md#health-and-metrics). No login: it says which service is down, never a setting's value."""
    components = readiness()
    ready = all(state == "ok" for state in components.values())
    body = {"status": "ready" if ready else "unavailable", "components": components}
    return JsonResponse(body, status=200 if ready else 503)


def _client_allowed(request) -> bool:
    token = settings.MADO_METRICS_TOKEN
    sent = request.headers.get("Authorization", "")
    if token and sent.startswith("Bearer ") and secrets.compare_digest(sent[7:].strip(), token):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in settings.MADO_METRICS_ALLOW_FROM)


def metrics_view(request) -> HttpResponse:
    """The Prometheus text exposition of this web process (``config.metrics.exposition``); 403 JSON for a caller
    with neither the metrics token nor an allowed address (docs/deploy.md#health-and-metrics)."""
    if not _client_allowed(request):
        detail = "send Authorization: Bearer <the metrics token>, or scrape from an allowed network"
        return JsonResponse({"error": "forbidden", "detail": detail, "field": None}, status=403)
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)


PATHS = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics_view}


class OperatorEndpointsMiddleware:
    """Answer ``/healthz``, ``/readyz`` and ``/metrics`` before host validation, HTTPS redirects and sessions."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        view = PATHS.get(request.path_info)
        if view is None:
            return self.get_response(request)
        return view(request)
