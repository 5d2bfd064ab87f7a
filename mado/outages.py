"""Outages answer like a service: 503 (or 507 when a volume is full), never an HTML 500 on an API path.

``outage_of(exc)`` recognises what failed by walking the exception's chain
(``__cause__`` / ``__context__``, so an error that wraps a connection error
counts too):

- the database: Django's (and psycopg's) ``OperationalError`` /
  ``InterfaceError``;
- the broker: kombu's ``OperationalError``, redis-py's connection and time-out
  errors;
- the artifact storage: botocore's connection and HTTP-client errors, and S3
  answers a client should retry (``SlowDown``, ``ServiceUnavailable``,
  ``InternalError``, any 5xx);
- no space: ``OSError`` ENOSPC / EDQUOT while writing bytes → 507 (not
  retried: the same bytes will not fit on the next try either).

Two hooks render it, so every path of the request is covered:
``OutageMiddleware.process_exception`` for errors raised by a view (DRF and
MLflow handlers leave outages to it), and ``server_error`` (``handler500``)
for errors raised by other middleware before or after the view (a session
or user loaded from an unreachable database). Django turns an exception
raised inside a middleware into a response at that layer, so no middleware
placed anywhere sees those; ``handler500`` does. API paths (``/api/v1/``,
MLflow's ``/api/2.0/mlflow/``, ``/api/2.0/mlflow-artifacts/`` and the same
under ``/mlflow/``) answer JSON in their own error shape; pages answer the
static ``503.html`` / ``507.html`` / ``500.html``, rendered without a
request context, so no database access is needed to show them. ``not_found``
(``handler404``) answers JSON on API paths as well.
"""

import errno
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

import kombu.exceptions
import psycopg
import redis.exceptions
from botocore.exceptions import ClientError as S3ClientError
from botocore.exceptions import ConnectionError as S3ConnectionError
from botocore.exceptions import HTTPClientError as S3HttpClientError
from django.db import InterfaceError as DjangoInterfaceError
from django.db import OperationalError as DjangoOperationalError
from django.http import HttpResponse, JsonResponse
from django.template import loader
from django.views import defaults

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # seconds a client should wait before it tries again (the ``Retry-After`` header)
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
RETRYABLE_S3_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"})
DRAIN_LIMIT = 1 << 30  # bytes of an unread request body read and dropped before answering
API_PREFIX = "/api/"
# Path prefixes whose clients read another JSON error shape: prefix -> body(code, mlflow_code, detail).
# Filled by the app that speaks the protocol (mlflow_api registers MLflow's from its AppConfig).
_ERROR_SHAPES: dict[str, Callable[[str, str, str], dict]] = {}


@dataclass(frozen=True)
class Outage:
    """What failed: ``component`` (database, broker, storage), HTTP ``status`` (503 or 507), ``code`` and ``detail``."""

    component: str
    status: int
    code: str
    detail: str
    mlflow_code: str


NO_SPACE = Outage(
    "storage",
    507,
    "insufficient_storage",
    "no space left on the artifact storage; free space or ask an administrator",
    "RESOURCE_EXHAUSTED",
)
DATABASE_ERRORS = (DjangoOperationalError, DjangoInterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class StorageUnreachable(Exception):
    """The artifact storage cannot be read (a file system that answers EIO / EACCES / ESTALE, a volume not mounted:
    its marker is gone): an outage, never a sign that a stored object is damaged (docs/design/checkpoints.md#damage)."""


def _storage_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, (StorageUnreachable, S3ConnectionError, S3HttpClientError)):
        return True
    if isinstance(exc, S3ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return error.get("Code") in RETRYABLE_S3_CODES or status >= 500
    return False


def is_no_space(exc: BaseException) -> bool:
    """True when ``exc`` (or an error in its chain) is ENOSPC / EDQUOT: the volume or quota is full."""
    return any(isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS for e in _chain(exc))


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def outage_of(exc: BaseException) -> Outage | None:
    """The ``Outage`` that ``exc`` reports, or None when it is an ordinary error (a bug: answered 500)."""
    if is_no_space(exc):
        return NO_SPACE
    for error in _chain(exc):
        if isinstance(error, DATABASE_ERRORS):
            component = "database"
        elif isinstance(error, BROKER_ERRORS):
            component = "broker"
        elif _storage_unavailable(error):
            component = "storage"
        else:
            continue
        return Outage(component, 503, "unavailable", f"{component} unavailable, retry", "TEMPORARILY_UNAVAILABLE")
    return None


def register_error_shape(prefixes: tuple[str, ...], body: Callable[[str, str, str], dict]) -> None:
    """Answer outages on paths under ``prefixes`` with ``body(code, mlflow_code, detail)`` as JSON.

    Called from an ``AppConfig.ready``; a prefix registered again is replaced.
    """
    _ERROR_SHAPES.update(dict.fromkeys(prefixes, body))


def is_api_path(path: str) -> bool:
    """True for paths whose clients read JSON (``/api/...`` and every prefix of ``register_error_shape``)."""
    return path.startswith((API_PREFIX, *_ERROR_SHAPES))


def _drain(request) -> None:
    """Read and drop what is left of the request body (at most ``DRAIN_LIMIT`` bytes).

    An outage often strikes before the body is read (S3 refuses the first
    part). Left unread, gunicorn closes the keep-alive connection after the
    answer, and the client's next request on it fails with "connection
    closed without response" instead of reaching the server.
    """
    remaining = DRAIN_LIMIT
    try:
        while remaining > 0 and (chunk := request.read(min(1 << 20, remaining))):
            remaining -= len(chunk)
    except Exception:  # noqa: BLE001 - the client went away: nobody is left to read the answer
        logger.debug("could not drain the request body", exc_info=True)


def _api_error(path: str, status: int, code: str, mlflow_code: str, detail: str) -> JsonResponse | None:
    """The JSON error of an API path in its shape (a registered one or the house's); None on a page path."""
    for prefix, body in _ERROR_SHAPES.items():
        if path.startswith(prefix):
            return JsonResponse(body(code, mlflow_code, detail), status=status)
    if is_api_path(path):
        return JsonResponse({"error": code, "detail": detail, "field": None}, status=status)
    return None


def outage_response(request, outage: Outage) -> HttpResponse:
    """The answer for ``outage``: JSON in the house or MLflow shape on API paths, a static page elsewhere.

    The rest of an unread request body is drained first (``_drain``) so the
    client reads this answer; 503 carries ``Retry-After`` (seconds).
    """
    _drain(request)
    response = _api_error(request.path_info, outage.status, outage.code, outage.mlflow_code, outage.detail)
    if response is None:
        response = HttpResponse(loader.render_to_string(f"{outage.status}.html"), status=outage.status)
    if outage.status == 503:
        response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class OutageMiddleware:
    """Turns an outage raised by a view into 503 / 507 (``outage_response``); first in ``MIDDLEWARE``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        outage = outage_of(exception)
        if outage is None:
            return None
        logger.warning(
            "%s %s: %s (%s: %s)", request.method, request.path, outage.detail, type(exception).__name__, exception
        )
        return outage_response(request, outage)


def server_error(request) -> HttpResponse:
    """``handler500``: an outage raised outside a view answers as one; other errors answer 500 (JSON on API paths)."""
    exception = sys.exc_info()[1]
    outage = outage_of(exception) if exception is not None else None
    if outage is not None:
        return outage_response(request, outage)
    return _api_error(
        request.path_info, 500, "internal", "INTERNAL_ERROR", "server error; it has been logged"
    ) or HttpResponse(loader.render_to_string("500.html"), status=500)


def not_found(request, exception) -> HttpResponse:
    """``handler404``: JSON on API paths (an unknown endpoint included), Django's 404 page elsewhere."""
    detail = f"no API endpoint at {request.path_info}"
    return _api_error(request.path_info, 404, "not_found", "ENDPOINT_NOT_FOUND", detail) or defaults.page_not_found(
        request, exception
    )
