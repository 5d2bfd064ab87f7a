"""One HTTP connection to the mado API (docs/api.md): auth header, JSON, error bodies, retries.

A ``requests.Session`` is not safe to share between threads, so every thread
that talks to the server (the caller's, the metric sender) owns an
``ApiClient``. Retries cover what is transient: the server unreachable, 408,
429, 502, 503 and 504 are retried with exponential backoff and jitter
(honouring ``Retry-After``) for up to ``MMT_RETRY_TIMEOUT`` seconds (default
600: a storage or database outage of a few minutes is routine), with a
progress line every 30 s; a 500 at most ``SERVER_ERROR_ATTEMPTS`` times. Any
other 4xx and 507 (the server's storage is full) are final: the same body is
never sent again.
"""

import json
import logging
import random
import time
from collections.abc import Callable

import requests

from mado_tracking._version import __version__
from mado_tracking.config import ENV_API_TOKEN, ENV_API_URL, ENV_RETRY_TIMEOUT, Config, retry_timeout
from mado_tracking.errors import ApiError

logger = logging.getLogger("mado_tracking")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
UNAVAILABLE_STATUSES = frozenset({408, 429, 502, 503, 504})  # retried until MMT_RETRY_TIMEOUT has passed
SERVER_ERROR_ATTEMPTS = 3  # a 500 is a bug more often than a blip: tried this many times at most
PROGRESS_EVERY_S = 30.0
# The SDK's own draws: the training code's global `random` stays as its seed and its own draws leave it, so a resumed
# run draws what an uninterrupted one would (docs/design/checkpoints.md#restore-check).
JITTER = random.Random()


def is_transient(status: int) -> bool:
    """True for answers worth retrying: 408, 429, 500, 502, 503, 504 (never another 4xx, 501 or 507)."""
    return status in UNAVAILABLE_STATUSES or status == 500


def jittered(seconds: float) -> float:
    """A wait of 80-100 % of ``seconds``, drawn anew on each call: never longer than asked, and processes that
    started together (a sweep's trials, a job array, a retry storm) drift apart instead of reaching the server
    in the same instant."""
    return seconds * JITTER.uniform(0.8, 1.0)


class Backoff:
    """Exponential backoff with jitter: ``base``, ``2·base``, … capped at ``cap`` seconds."""

    def __init__(self, base: float = 0.5, cap: float = 30.0):
        self.base = base
        self.cap = cap
        self.attempt = 0

    def next_delay(self, retry_after: float | None = None) -> float:
        """Seconds to wait before the next attempt; a server's ``Retry-After`` wins (still capped)."""
        delay = min(self.base * (2**self.attempt), self.cap)
        self.attempt += 1
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.cap)
        return jittered(delay)

    def reset(self) -> None:
        self.attempt = 0


class Retrier:
    """The retries of one operation, ``what`` (``"PUT checkpoints/7/tar"``), for up to ``timeout`` seconds.

    ``timeout`` defaults to ``MMT_RETRY_TIMEOUT`` (600 s); ``attempts``
    (None: only the time limits) bounds the tries, and a 500 is tried at
    most ``SERVER_ERROR_ATTEMPTS`` times. ``pause(reason, ...)`` sleeps the
    next backoff delay and returns True, or returns False when the next try
    would start after the deadline or the tries are used up. While it keeps
    retrying it logs a warning line every ``PROGRESS_EVERY_S`` seconds.
    """

    def __init__(
        self, what: str, *, attempts: int | None = None, timeout: float | None = None, backoff: Backoff | None = None
    ):
        self.what = what
        self.attempts = attempts
        self.timeout = retry_timeout() if timeout is None else timeout
        self.backoff = backoff or Backoff()
        self.started = time.monotonic()
        self.tries = 0
        self.server_errors = 0
        self._next_progress = self.started + PROGRESS_EVERY_S

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def summary(self) -> str:
        """``"gave up after 12 tries in 601 s (MMT_RETRY_TIMEOUT=600)"``: for the final error message."""
        return f"gave up after {self.tries} tries in {self.elapsed():.0f} s ({ENV_RETRY_TIMEOUT}={self.timeout:g})"

    def pause(self, reason: str, *, status: int | None = None, retry_after: float | None = None) -> bool:
        """Count a failed try (``status``: its HTTP status, None when unreachable); sleep and True, or False."""
        self.tries += 1
        self.server_errors += status == 500
        delay = self.backoff.next_delay(retry_after)
        if (self.attempts is not None and self.tries >= self.attempts) or self.server_errors >= SERVER_ERROR_ATTEMPTS:
            return False
        if self.elapsed() + delay > self.timeout:
            return False
        now = time.monotonic()
        if now >= self._next_progress:
            self._next_progress = now + PROGRESS_EVERY_S
            logger.warning(
                "mado: %s still failing after %.0f s (%s); retrying for up to %.0f s more",
                self.what,
                self.elapsed(),
                reason,
                max(self.timeout - self.elapsed(), 0.0),
            )
        else:
            logger.info("mado: %s: %s; retrying in %.1f s", self.what, reason, delay)
        time.sleep(delay)
        return True


def retry_after_seconds(response: requests.Response) -> float | None:
    """The ``Retry-After`` header in seconds, or None when absent or given as a date."""
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


def body_detail(response: requests.Response, limit: int = 300) -> str:
    """What an error answer says, for a message: the JSON ``detail`` (or MLflow's ``message``), short plain text,
    or, for an HTML page (a proxy's error page), only its status reason: HTML is never printed."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        detail = payload.get("detail", payload.get("message"))
        if detail is not None:
            return str(detail)[:limit]
    content_type = response.headers.get("Content-Type", "").lower()
    text = (response.text or "").strip()
    if "html" in content_type or text[:100].lstrip().lower().startswith(("<!doctype html", "<html")):
        return f"{response.reason or 'error'} (an HTML page, not shown)"
    return (text or response.reason or "")[:limit]


class ApiClient:
    """Authenticated JSON requests against ``<api_url>/api/v1/``.

    ``request`` returns the decoded JSON body (None for 204) and raises
    ``ApiError``: for a refused request at once, for a transient failure
    after ``attempts`` tries. ``headers`` go with every request of this
    client (a Run's ``Mado-Fencing-Token``).
    """

    def __init__(self, config: Config, *, read_timeout: float = READ_TIMEOUT_S, headers: dict | None = None):
        self.config = config
        self.read_timeout = read_timeout
        self.session = requests.Session()
        self.session.headers.update(
            {
                "Authorization": f"Bearer {config.api_token}",
                "Accept": "application/json",
                "User-Agent": f"mado-tracking/{__version__}",
                **(headers or {}),
            }
        )

    def url(self, path: str) -> str:
        """Absolute URL of an API path (``runs/3/``); absolute URLs (``next`` links) pass through."""
        if path.startswith(("http://", "https://")):
            return path
        return self.config.api_base + path.lstrip("/")

    def send(
        self,
        method: str,
        path: str,
        *,
        body=None,
        raw: bytes | None = None,
        params: dict | None = None,
        timeout: float | None = None,
        headers: dict | None = None,
    ) -> requests.Response:
        """One attempt; ``body`` is encoded as JSON, ``raw`` is JSON text already encoded.

        ``headers`` are added to the request (e.g. ``Idempotency-Key``). Raises
        ``requests.RequestException`` when the server cannot be reached.
        """
        data = raw
        headers = dict(headers or {})
        if body is not None:
            # allow_nan=False: bare NaN is not JSON; non-finite metric values travel as strings.
            data = json.dumps(body, allow_nan=False)
        if data is not None:
            headers["Content-Type"] = "application/json"
        read = self.read_timeout if timeout is None else min(timeout, self.read_timeout)
        connect = min(CONNECT_TIMEOUT_S, read)
        return self.session.request(
            method, self.url(path), data=data, params=params, headers=headers, timeout=(connect, read)
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        body=None,
        params: dict | None = None,
        attempts: int | None = None,
        backoff: Backoff | None = None,
        on_retry: Callable[[], None] | None = None,
        headers: dict | None = None,
        raw: bytes | None = None,
    ):
        """Send, retrying transient failures (``Retrier``); return the JSON answer.

        ``attempts`` bounds the tries (None: until ``MMT_RETRY_TIMEOUT``
        seconds have passed); ``on_retry`` is called before each retry (the
        caller learns the first attempt may have reached the server);
        ``headers`` go with every attempt (an ``Idempotency-Key`` makes the
        retries safe); ``raw`` is a JSON body already encoded. Raises
        ``ApiError``: at once for a 4xx (but 408 / 429) or 507, after the
        retries for an unreachable server or a 5xx.
        """
        retrier = Retrier(f"{method} {path}", attempts=attempts, backoff=backoff)
        while True:
            status = retry_after = None
            try:
                response = self.send(method, path, body=body, raw=raw, params=params, headers=headers)
            except requests.RequestException as exc:
                error = ApiError(
                    f"cannot reach the mado API at {self.config.api_url} ({type(exc).__name__}: {exc}); "
                    f"check {ENV_API_URL}"
                )
            else:
                if response.status_code < 400:
                    return self.decode(response, method, path)
                error = self.error_from(response, method, path)
                if not is_transient(response.status_code):
                    raise error
                status, retry_after = response.status_code, retry_after_seconds(response)
            if not retrier.pause(str(error), status=status, retry_after=retry_after):
                raise ApiError(
                    f"{error}; {retrier.summary()}",
                    status=error.status,
                    code=error.code,
                    detail=error.detail,
                    field=error.field,
                )
            if on_retry is not None:
                on_retry()

    def decode(self, response: requests.Response, method: str, path: str):
        """The JSON body of a successful answer (None when empty); ``ApiError`` when it is not JSON."""
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ApiError(
                f"{method} {self.url(path)} answered {response.status_code} with "
                f"{response.headers.get('Content-Type', 'no content type')}, not JSON; "
                f"is {ENV_API_URL} the root of a mado server?",
                status=response.status_code,
            ) from None

    def error_from(self, response: requests.Response, method: str, path: str) -> ApiError:
        """An ``ApiError`` built from the API's ``{"error", "detail", "field"}`` body (``body_detail`` otherwise)."""
        code = field = None
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            code, field = payload.get("error"), payload.get("field")
        detail = body_detail(response)
        where = f" (field {field})" if field else ""
        message = f"{method} {self.url(path)} -> HTTP {response.status_code} {code or ''}{where}: {detail}"
        if response.status_code == 401:  # DRF's detail ends with a full stop: "Invalid token."
            message = f"{message.rstrip().rstrip('.')}; check {ENV_API_TOKEN}"
        return ApiError(message, status=response.status_code, code=code, detail=detail, field=field)

    def close(self) -> None:
        self.session.close()
