"""Log lines an operator can follow: a request id on every line a request logs, and JSON on request.

``RequestIdMiddleware`` takes the caller's ``X-Request-ID`` (a proxy or load balancer sets one; up to 64
characters of letters, digits, ``-``, ``_``, ``.``) or makes one, answers it in the same header and keeps it in a
context variable for the request's duration; ``RequestIdFilter`` puts it on every record as ``request_id``
(``-`` outside a request), so ``MADO_LOG_FORMAT=json`` (``config/settings.py``) writes it as a field of each line
(docs/deploy.md#logs).
"""

import logging
import re
import uuid
from contextvars import ContextVar

REQUEST_ID_HEADER = "X-Request-ID"
_ACCEPTED = re.compile(r"[A-Za-z0-9._-]{1,64}")  # the audit log keeps up to 64
_current: ContextVar[str] = ContextVar("mado_request_id", default="-")


def current_request_id() -> str:
    """The id of the request this thread serves, or ``"-"`` outside a request."""
    return _current.get()


class RequestIdMiddleware:
    """Give each request an id (the caller's ``X-Request-ID`` when well formed, else a new one) and answer it."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        offered = request.headers.get(REQUEST_ID_HEADER, "")
        request_id = offered if _ACCEPTED.fullmatch(offered) else uuid.uuid4().hex
        request.request_id = request_id
        token = _current.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            _current.reset(token)
        response[REQUEST_ID_HEADER] = request_id
        return response


class RequestIdFilter(logging.Filter):
    """Add ``request_id`` to every record (the JSON formatter writes it; plain text may use ``%(request_id)s``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _current.get()
        return True
