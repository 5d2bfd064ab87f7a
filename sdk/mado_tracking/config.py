"""Where the SDK finds its server, token and project (arguments first, then ``MMT_*`` variables)."""

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from mado_tracking import credentials
from mado_tracking.errors import ConfigError

ENV_API_URL = "MMT_API_URL"
ENV_API_TOKEN = "MMT_API_TOKEN"
ENV_PROJECT = "MMT_PROJECT"
ENV_RETRY_TIMEOUT = "MMT_RETRY_TIMEOUT"
DEFAULT_RETRY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Config:
    """Resolved settings. ``api_url`` is the server root (``http://host:8000``), without ``/api/v1``."""

    api_url: str
    api_token: str
    project: str | None = None

    @property
    def api_base(self) -> str:
        """The API root every resource path is relative to: ``<api_url>/api/v1/``."""
        return f"{self.api_url}/api/v1/"


def _pick(value: str | None, env: str) -> str | None:
    value = value if value is not None else os.environ.get(env)
    value = (value or "").strip()
    return value or None


def normalize_api_url(url: str) -> str:
    """``http://host:8000``, ``http://host:8000/`` and ``http://host:8000/api/v1/`` all mean the same server.

    Raises ``ConfigError`` unless ``url`` is an absolute http(s) URL.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"the mado API URL must look like http://host:8000, got {url!r} (api_url / {ENV_API_URL})")
    path = parts.path.rstrip("/")
    if path.endswith("/api/v1"):
        path = path[: -len("/api/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def server_identity(api_url: str) -> str:
    """The server ``api_url`` names, in one spelling: ``http://127.0.0.1:8000`` for ``HTTP://LocalHost:8000/``.

    What the SDK keys its local state by (points kept for a resume, background
    checkpoint snapshots, extracted checkpoints), so another spelling of the
    same server finds it: ``normalize_api_url`` first (trailing slash,
    ``/api/v1``), then a lower-case scheme and host without a trailing dot, the
    scheme's default port (80, 443) dropped, user info dropped, and every
    loopback host (``localhost``, ``127.0.0.0/8``, ``::1``, ``0.0.0.0``) written
    ``127.0.0.1``: they all reach this machine. Names are not resolved (a
    host's name and its address are two keys). Raises ``ConfigError`` as
    ``normalize_api_url``.
    """
    parts = urlsplit(normalize_api_url(api_url))
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if host == "localhost" or host.startswith("127.") or host in ("::1", "0.0.0.0"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    shown_port = "" if port is None or port == _DEFAULT_PORTS.get(scheme) else f":{port}"
    return f"{scheme}://{host}{shown_port}{parts.path}"


def resolve(
    *,
    api_url: str | None = None,
    api_token: str | None = None,
    project: str | None = None,
    require_project: bool = True,
) -> Config:
    """Settings from the arguments, falling back to ``MMT_API_URL``, ``MMT_API_TOKEN``, ``MMT_PROJECT``, then to
    the token ``mado login`` kept for the server (``mado_tracking.credentials``).

    An argument that is not ``None`` wins over its variable. Raises
    ``ConfigError`` naming the argument and the variable of the first missing
    setting; the project is only required when ``require_project`` is true.
    """
    url = _pick(api_url, ENV_API_URL)
    token = _pick(api_token, ENV_API_TOKEN)
    if token is None:  # the token `mado login` kept for this server (or for the last one logged into)
        kept = credentials.lookup(server_identity(url) if url else None)
        if kept is not None:
            url, token = url or kept["api_url"], kept["token"]
    if url is None:
        raise ConfigError(
            f"no mado API URL: pass api_url=... (mado: --api-url), set {ENV_API_URL} (e.g. http://127.0.0.1:8000) "
            "or run `mado login`"
        )
    if token is None:
        raise ConfigError(
            f"no mado API token: run `mado login`, pass api_token=... (mado: --api-token) or set {ENV_API_TOKEN} "
            "(make one on your account page)"
        )
    slug = _pick(project, ENV_PROJECT)
    if slug is None and require_project:
        raise ConfigError(f"no mado project: pass project=... or set {ENV_PROJECT} to the project's slug")
    return Config(api_url=normalize_api_url(url), api_token=token, project=slug)


def retry_timeout() -> float:
    """Seconds a request keeps retrying while the server is unavailable: ``MMT_RETRY_TIMEOUT``, default 600.

    Read at each use, so a program may change it while it runs. Raises
    ``ConfigError`` when the variable is set to something other than a
    number >= 0 (0: one try, no retry).
    """
    raw = (os.environ.get(ENV_RETRY_TIMEOUT) or "").strip()
    if not raw:
        return DEFAULT_RETRY_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{ENV_RETRY_TIMEOUT} must be a number of seconds >= 0, got {raw!r}")
    return value
