"""The two error families of mado (docs/design/house.md#where-logic-goes) and their JSON shape in the API.

``UserError`` and its subclasses are the caller's problem (bad input, wrong
state, forbidden): shown to the user, never retried. ``InternalError`` is ours:
logged and, when transient, retried. The API renders every error as
``{"error": code, "detail": text, "field": name-or-null}``.
"""

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class UserError(Exception):
    """Bad input or a request the current state refuses; HTTP status in ``status``."""

    status = 400
    code = "invalid"

    def __init__(self, detail: str, *, field: str | None = None, extra: dict | None = None):
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.extra = extra or {}


class ValidationFailed(UserError):
    status = 400
    code = "invalid"


class NotFound(UserError):
    status = 404
    code = "not_found"


class Forbidden(UserError):
    status = 403
    code = "forbidden"


class Conflict(UserError):
    status = 409
    code = "conflict"


class RunLive(Conflict):
    """Same-run resume refused: another process holds the Run's lease (heartbeat fresh;
    docs/design/runs.md#one-writer-process)."""

    code = "run_live"


class LeaseLost(Conflict):
    """A write carrying a stale fencing token: another process took the Run over
    (docs/design/runs.md#one-writer-process)."""

    code = "lease_lost"


class RunEnded(Conflict):
    """A heartbeat for a Run that already ended (crashed included): only a resume revives it
    (docs/design/runs.md#states)."""

    code = "run_ended"


class TooLarge(UserError):
    """A request body over what the API reads into memory (``MADO_API_MAX_BODY_BYTES``)."""

    status = 413
    code = "too_large"


class InternalError(Exception):
    """Our fault (storage unreachable, broken invariant): logged, retried if transient."""


def _body(code: str, detail, field=None, extra=None) -> dict:
    body = {"error": code, "detail": detail, "field": field}
    body.update(extra or {})
    return body


def _flatten_validation(detail, prefix: str = "") -> tuple[str | None, str]:
    """First (field, message) of a DRF ValidationError detail, field as a dotted path."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = key if key != "non_field_errors" else None
            path = f"{prefix}.{name}" if prefix and name else (name or prefix or None)
            return _flatten_validation(value, path or "")
    if isinstance(detail, list) and detail:
        for index, item in enumerate(detail):
            if item:
                nested = isinstance(item, (dict, list))
                path = f"{prefix}[{index}]" if nested and prefix else prefix
                return _flatten_validation(item, path)
    return (prefix or None), str(detail)


def api_exception_handler(exc, context):
    """DRF exception handler: every error becomes ``{"error", "detail", "field"}``.

    A body over Django's in-memory limits (raised while DRF parses it) answers 413 naming the limit
    (docs/checkpoint-format.md#limits-settings) instead of Django's HTML 400.
    """
    if isinstance(exc, (RequestDataTooBig, TooManyFieldsSent)):
        exc = _too_large(exc)
    if isinstance(exc, UserError):
        return Response(_body(exc.code, exc.detail, exc.field, exc.extra), status=exc.status)
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf_exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, drf_exceptions.ValidationError):
        field, message = _flatten_validation(exc.detail)
        response.data = _body("invalid", message, field, {"errors": exc.detail})
    elif isinstance(exc, drf_exceptions.APIException):
        code = {401: "unauthenticated", 403: "forbidden", 404: "not_found"}.get(
            response.status_code, exc.get_codes() if isinstance(exc.get_codes(), str) else "error"
        )
        response.data = _body(code, str(exc.detail))
    return response


def _too_large(exc: Exception) -> TooLarge:
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return TooLarge(f"The request sends more than {limit} form fields; send fewer at a time.")
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return TooLarge(
        f"The request body is larger than {limit} bytes, the most the API reads at once; "
        "send less at a time (a checkpoint with many files can declare manifest_sha256 instead of its manifest)."
    )
