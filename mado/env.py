"""Typed reading of environment variables for settings (docs/design/house.md#settings).

Each helper fails loudly with the variable's name when a value cannot be
parsed, and reads ``<NAME>_FILE`` (a path whose content is the value) when
``<NAME>`` itself is unset, so secrets can come from mounted files.
"""

import ipaddress
import math
import os
import signal
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    """Return the variable ``name`` (or the content of ``name_FILE``), else ``default``."""
    if name in os.environ:
        return os.environ[name]
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from exc
    return default


def env_url(name: str) -> str | None:
    """An absolute ``http`` or ``https`` URL with a host (``https://s3.example.com:9000``), None when unset or empty;
    anything else is an error naming the variable."""
    raw = (env_str(name) or "").strip()
    if not raw:
        return None
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a URL ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(f"{name}={raw!r} must be an http:// or https:// URL with a host")
    return raw


def env_bool(name: str, default: bool) -> bool:
    """Parse ``1/0 true/false yes/no on/off``; anything else is an error naming the variable."""
    raw = env_str(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """Parse an integer, optionally bounded below; a bad value is an error naming the variable."""
    raw = env_str(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be >= {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Parse a comma-separated list; empty items are dropped."""
    raw = env_str(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Return one of ``choices``; anything else is an error listing them."""
    value = env_str(name, default) or default
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def env_networks(name: str, default: list[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Parse a comma-separated list of addresses or networks (``10.0.0.0/8,::1``); a bad item is an error naming
    the variable and the item."""
    networks = []
    for item in env_list(name, default):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an address or network ({exc})") from exc
    return tuple(networks)


class NetworkPort(NamedTuple):
    """An address or network, and the one TCP port it is open on (``None``: every port)."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    port: int | None


def network_port(item: str) -> NetworkPort:
    """Parse ``10.0.0.0/8``, ``::1``, ``10.0.0.5:8443``, ``10.0.0.0/8:8443``, ``[2001:db8::/32]:8443`` or
    ``[::1]``; an IPv6 entry with a port is in brackets. Raises ``ValueError`` with the reason."""
    text, port = item, None
    if item.startswith("["):
        inner, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError("an IPv6 entry with a port is written [address or network]:port")
        text, port = inner, rest[1:] if rest else None
    elif item.count(":") == 1:  # an IPv6 address has two colons at least
        text, _, port = item.partition(":")
    if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"the port {port!r} is not a number from 1 to 65535")
    return NetworkPort(ipaddress.ip_network(text, strict=False), int(port) if port is not None else None)


def env_network_ports(name: str, default: list[str]) -> tuple[NetworkPort, ...]:
    """Parse a comma-separated list of addresses or networks, each optionally limited to one port (``network_port``:
    ``10.20.0.0/16,10.0.0.5:8443,[2001:db8::/32]:443``); a bad item is an error naming the variable and the item."""
    entries = []
    for item in env_list(name, default):
        try:
            entries.append(network_port(item))
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not an address or network, optionally with :port ({exc})"
            ) from exc
    return tuple(entries)


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    """Parse a finite number (``2.5``), optionally bounded below; a bad value (``nan``, ``inf`` included) is an error
    naming the variable."""
    raw = env_str(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from exc
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be >= {minimum}")
    return value


UNCATCHABLE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGSTOP})


def env_signal(name: str, default: signal.Signals) -> signal.Signals:
    """Parse a signal name (``SIGTERM``, ``TERM``, ``sigusr1``) into ``signal.Signals``; an unknown name, a number or
    a signal no program can catch (SIGKILL, SIGSTOP: no handler would run) is an error naming the variable."""
    raw = env_str(name)
    if raw is None:
        return default
    text = raw.strip().upper()
    found = signal.Signals.__members__.get(text if text.startswith("SIG") else f"SIG{text}")
    if found is None:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a signal name (e.g. SIGTERM, SIGINT, SIGUSR1)")
    if found in UNCATCHABLE_SIGNALS:
        raise ImproperlyConfigured(
            f"{name}={raw!r}: {found.name} cannot be caught, so the code could not save first; use SIGTERM"
        )
    return found
