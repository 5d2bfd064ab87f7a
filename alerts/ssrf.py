"""Webhook URLs cannot be pointed inward (docs/design/alerts.md#ssrf).

A URL is refused when it is not a well-formed http(s) URL, or when its host
resolves to any address that is not globally reachable: loopback, private,
link-local (the cloud metadata address 169.254.169.254 among them),
carrier-grade NAT, multicast, reserved, unspecified, and every other range of
IANA's IPv4 and IPv6 special-purpose address registries that is not globally
reachable, with 6to4, Teredo, NAT64 and the old site-local range, unless the
operator opened that address on that port in ``MADO_ALERT_WEBHOOK_ALLOW``
(``mado.env.network_port`` entries). An IPv4-mapped IPv6 address is judged by
the IPv4 address inside it. The check runs when a channel is created and again
before every request of a delivery and after every redirect (``post_guarded``
follows at most ``MAX_REDIRECTS`` itself, never from https to http), and the
request connects to the very address that was checked (TLS still verifies the
host name), so a name that resolves differently a moment later (DNS
rebinding) cannot slip through.
"""

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import certifi
import urllib3
from django.conf import settings

MAX_REDIRECTS = 3
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
# Special-purpose ranges Python's ``is_global`` (3.11) counts as global although IANA's registries do not, or
# which lead into another network (6to4, Teredo, NAT64), beside the not globally reachable ranges, multicast and
# reserved it knows; an IPv4-mapped address (::ffff:0:0/96) is judged by the IPv4 address inside it.
SPECIAL = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "192.0.0.0/24",  # IETF protocol assignments
        "192.88.99.0/24",  # 6to4 relay anycast
        "64:ff9b::/96",  # NAT64
        "64:ff9b:1::/48",  # local-use NAT64
        "2001::/32",  # Teredo
        "2002::/16",  # 6to4
        "3fff::/20",  # documentation
        "fec0::/10",  # site-local
    )
)
_CONTROL = re.compile(r"[\x00-\x20\x7f-\x9f\s]")
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")


class UrlRefused(Exception):
    """The URL may not be reached; ``str()`` says why in a sentence a user can act on."""


@dataclass(frozen=True)
class Target:
    """A checked URL: ``host`` in ASCII (IDNA), ``port`` and ``address`` the ones to connect to, ``path`` the
    request line's path and query."""

    url: str
    scheme: str
    host: str
    port: int
    host_header: str
    path: str
    address: str


def _shown(text: str) -> str:
    return repr(text if len(text) <= 200 else text[:200] + "…")


def _host_port(url: str, netloc: str) -> tuple[str, str]:
    """The ASCII host and the port's text ("" when the URL has none) of ``netloc``; a user name and password
    before ``@`` are not sent."""
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        literal, bracket, rest = hostport[1:].partition("]")
        try:
            if not bracket:
                raise ValueError("the bracket is not closed")
            if "%" in literal:
                raise ValueError("a zone such as %eth0 cannot be reached")
            host = str(ipaddress.IPv6Address(literal))
        except ValueError as exc:
            raise UrlRefused(f"{_shown(url)} has a malformed IPv6 address in brackets ({exc}).") from exc
    else:
        name, colon, after = hostport.partition(":")
        rest = colon + after
        try:
            host = name.encode("idna").decode("ascii").lower() if name else ""
        except UnicodeError as exc:
            raise UrlRefused(f"{_shown(url)} has no valid host name ({exc}).") from exc
        if not _NAME.fullmatch(host):
            raise UrlRefused(f"{_shown(url)} is not an http or https URL with a host.")
    port = rest[1:]
    if rest and (not re.fullmatch(r":[0-9]{0,5}", rest) or port and not 1 <= int(port) <= 65535):
        raise UrlRefused(f"{_shown(url)} has a bad port: give a number from 1 to 65535 after the host.")
    return host, port


def _parse(url: str) -> dict:
    """The fields of ``url``'s ``Target`` but its address; ``UrlRefused`` naming what is malformed."""
    if _CONTROL.search(url):
        raise UrlRefused(f"{_shown(url)} contains a space or a control character.")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a bracket not closed, a bad IPv6 literal
        raise UrlRefused(f"{_shown(url)} is not a valid URL ({exc}).") from exc
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UrlRefused(f"{_shown(url)} is not an http or https URL with a host.")
    host, port = _host_port(url, parts.netloc)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not path.isascii():
        raise UrlRefused(f"{_shown(url)} has characters in its path that must be percent-encoded.")
    shown_host = f"[{host}]" if ":" in host else host
    return {
        "url": url,
        "scheme": parts.scheme,
        "host": host,
        "port": int(port) if port else (443 if parts.scheme == "https" else 80),
        "host_header": f"{shown_host}:{port}" if port else shown_host,
        "path": path,
    }


def _special(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return (
        not address.is_global
        or address.is_multicast
        or address.is_reserved
        or any(address in network for network in SPECIAL)
    )


def _allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, *, any_port: bool = False) -> bool:
    return any(
        address in entry.network and (any_port or entry.port in (None, port))
        for entry in settings.MADO_ALERT_WEBHOOK_ALLOW
    )


def check_url(url: str) -> Target:
    """The checked ``Target`` of ``url``; raises ``UrlRefused`` with the reason unless ``url`` is a well-formed http
    or https URL (host, port 1-65535, no space or control character) whose host resolves only to globally reachable
    addresses or to addresses the operator allowed on its port.

    Resolution errors refuse too (nothing to reach); the target's ``address`` is the first address resolved.
    """
    target = _parse(url)
    host, port = target["host"], target["port"]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:
        raise UrlRefused(f"the host {host!r} does not resolve ({exc}).") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        judged = address.ipv4_mapped or address if address.version == 6 else address
        if not _special(judged) or _allowed(address, port) or _allowed(judged, port):
            continue
        shown = address if judged == address else f"{address} ({judged})"
        kind = "a loopback, private, link-local or metadata address or another special-purpose one"
        if _allowed(address, port, any_port=True) or _allowed(judged, port, any_port=True):
            raise UrlRefused(f"{host} resolves to {shown}, {kind}, reachable on other ports only, not on {port}.")
        raise UrlRefused(
            f"{host} resolves to {shown}, {kind}: webhooks may not reach the server's own network "
            "(an operator may allow a range)."
        )
    return Target(**target, address=infos[0][4][0].split("%")[0])


def _follow(previous: Target, location: str) -> Target:
    try:
        target = check_url(urljoin(previous.url, location))
    except (UrlRefused, ValueError) as exc:
        raise UrlRefused(f"the redirect to {_shown(location)} is refused: {exc}") from exc
    if previous.scheme == "https" and target.scheme == "http":
        raise UrlRefused(f"the redirect to {_shown(location)} is refused: it leaves https for http.")
    return target


class Answer:
    """What the receiver answered: ``status_code`` and the start of its body as ``text``."""

    def __init__(self, status: int, body: bytes):
        self.status_code = status
        self.text = body[:1000].decode("utf-8", "replace")


def _post_pinned(target: Target, *, data: bytes, headers: dict, timeout: float):
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            target.address,
            target.port,
            server_hostname=target.host,
            assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED",
            ca_certs=certifi.where(),
        )
    else:
        pool = urllib3.HTTPConnectionPool(target.address, target.port)
    with pool:
        return pool.urlopen(
            "POST",
            target.path,
            body=data,
            headers={**headers, "Host": target.host_header},
            redirect=False,
            retries=False,
            timeout=urllib3.Timeout(total=timeout),
            preload_content=True,
        )


def post_guarded(url: str, *, data: bytes, headers: dict, timeout: float) -> Answer:
    """POST ``data`` to ``url``, following up to ``MAX_REDIRECTS`` redirects, each target checked first
    (``check_url``, and never from https to http) and connected to at the checked address.

    Raises ``UrlRefused`` for a refused URL (first or redirected) or one redirect too many, and ``OSError`` or
    ``urllib3.exceptions.HTTPError`` for a network error; returns the last answer (any status).
    """
    target, hops = check_url(url), 0
    while True:
        response = _post_pinned(target, data=data, headers=headers, timeout=timeout)
        location = response.headers.get("Location")
        if response.status not in REDIRECT_STATUSES or not location:
            return Answer(response.status, response.data)
        if hops == MAX_REDIRECTS:
            raise UrlRefused(f"more than {MAX_REDIRECTS} redirects (the next to {_shown(location)}).")
        target, hops = _follow(target, location), hops + 1
