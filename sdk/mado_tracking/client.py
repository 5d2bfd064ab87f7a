"""One HTTP connection to the mado API (docs/api.md): auth header, JSON, error bodies, bounded retries.

A ``requests.Session`` is not safe to share between threads, so every thread
that talks to the server (the caller's, the metric sender) owns an
``ApiClient``. Retries cover what is transient: the server unreachable, a
5xx, 408 or 429 (honouring ``Retry-After``); any other 4xx is final.
"""

import json
import logging
import random
import time
from collections.abc import Callable

import requests

from mado_tracking._version import __version__
from mado_tracking.config import ENV_API_TOKEN, ENV_API_URL, Config
from mado_tracking.errors import ApiError

logger = logging.getLogger("mado_tracking")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0


def is_transient(status: int) -> bool:
    """True for answers worth retrying: 408, 429 and every 5xx."""
    return status in (408, 429) or status >= 500


class Backoff:
    """Exponential backoff with jitter: ``base``, ``2·base``, … capped at ``cap`` seconds."""

    def __init__(self, base: float = 0.5, cap: float = 30.0):
        self.base = base
        self.cap = cap
        self.attempt = 0

    def next_delay(self, retry_after: float | None = None) -> float:
        """Seconds to wait before the next attempt; a server's ``Retry-After`` wins (still capped)."""
        delay = min(self.base * (2 ** self.attempt), self.cap)
        self.attempt += 1
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.cap)
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.attempt = 0


def retry_after_seconds(response: requests.Response) -> float | None:
    """The ``Retry-After`` header in seconds, or None when absent or given as a date."""
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


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
        self.session.headers.update({
            "Authorization": f"Bearer {config.api_token}",
            "Accept": "application/json",
            "User-Agent": f"mado-tracking/{__version__}",
            **(headers or {}),
        })

    def url(self, path: str) -> str:
        """Absolute URL of an API path (``runs/3/``); absolute URLs (``next`` links) pass through."""
        if path.startswith(("http://", "https://")):
            return path
        return self.config.api_base + path.lstrip("/")

    def send(self, method: str, path: str, *, body=None, raw: bytes | None = None, params: dict | None = None,
             timeout: float | None = None, headers: dict | None = None) -> requests.Response:
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
        return self.session.request(method, self.url(path), data=data, params=params, headers=headers,
                                    timeout=(connect, read))

    def request(self, method: str, path: str, *, body=None, params: dict | None = None, attempts: int = 5,
                backoff: Backoff | None = None, on_retry: Callable[[], None] | None = None,
                headers: dict | None = None, raw: bytes | None = None):
        """Send with up to ``attempts`` tries on transient failures; return the JSON answer.

        ``on_retry`` is called before each retry (the caller learns the first
        attempt may have reached the server); ``headers`` go with every
        attempt (an ``Idempotency-Key`` makes the retries safe); ``raw`` is a
        JSON body already encoded. Raises ``ApiError``.
        """
        backoff = backoff or Backoff()
        for attempt in range(1, attempts + 1):
            try:
                response = self.send(method, path, body=body, raw=raw, params=params, headers=headers)
            except requests.RequestException as exc:
                error = ApiError(
                    f"cannot reach the mado API at {self.config.api_url} ({type(exc).__name__}: {exc}); "
                    f"check {ENV_API_URL}"
                )
                delay = backoff.next_delay()
            else:
                if response.status_code < 400:
                    return self.decode(response, method, path)
                error = self.error_from(response, method, path)
                if not is_transient(response.status_code):
                    raise error
                delay = backoff.next_delay(retry_after_seconds(response))
            if attempt == attempts:
                raise error
            logger.info("mado: %s; retrying in %.1f s", error, delay)
            if on_retry is not None:
                on_retry()
            time.sleep(delay)
        raise AssertionError("unreachable")

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
        """An ``ApiError`` built from the API's ``{"error", "detail", "field"}`` body (or the raw text)."""
        code = detail = field = None
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            code, detail, field = payload.get("error"), payload.get("detail"), payload.get("field")
        if detail is None:
            detail = (response.text or response.reason or "").strip()[:300]
        where = f" (field {field})" if field else ""
        message = f"{method} {self.url(path)} -> HTTP {response.status_code} {code or ''}{where}: {detail}"
        if response.status_code == 401:
            message += f"; check {ENV_API_TOKEN}"
        return ApiError(message, status=response.status_code, code=code, detail=detail, field=field)

    def close(self) -> None:
        self.session.close()
