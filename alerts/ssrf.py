"""Webhook URLs cannot be pointed inward (docs/design/alerts.md#ssrf).

A URL is refused when its host resolves to any loopback, private,
link-local (the cloud metadata address 169.254.169.254 among them),
carrier-grade NAT, multicast, reserved or unspecified address, unless the
operator opened that range in ``MADO_ALERT_WEBHOOK_ALLOW`` (CIDRs). The check
runs when a channel is created and again before every request of a
delivery, after every redirect (``post_guarded`` follows redirects itself),
and the request connects to the very address that was checked (TLS still
verifies the host name), so a name that resolves differently a moment later
(DNS rebinding) cannot slip through.
"""

import ipaddress
import socket
from urllib.parse import urljoin, urlsplit

import certifi
import urllib3
from django.conf import settings

MAX_REDIRECTS = 5
METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}


class UrlRefused(Exception):
    """The URL may not be reached; ``str()`` says why in a sentence a user can act on."""


def _allowed_networks() -> list:
    return [ipaddress.ip_network(cidr, strict=False) for cidr in settings.MADO_ALERT_WEBHOOK_ALLOW]


def _inward(address) -> bool:
    if address.version == 6 and address.ipv4_mapped:
        address = address.ipv4_mapped
    return (
        address in METADATA
        or address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (address.version == 4 and address in ipaddress.ip_network("100.64.0.0/10"))
    )


def check_url(url: str) -> str:
    """Raise ``UrlRefused`` unless ``url`` is http(s) and every address its host resolves to is outward (or allowed);
    the first address (to connect to).

    ``url``: an absolute URL. Resolution errors refuse too (nothing to reach).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused(f"{url!r} is not an http or https URL with a host.")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UrlRefused(f"the host {parts.hostname!r} does not resolve ({exc}).") from exc
    allowed = _allowed_networks()
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if _inward(address) and not any(address in network for network in allowed):
            raise UrlRefused(
                f"{parts.hostname} resolves to {address}, a loopback, private, link-local or metadata address: "
                "webhooks may not reach the server's own network (an operator may allow a range)."
            )
    return infos[0][4][0].split("%")[0]


class Answer:
    """What the receiver answered: ``status_code`` and the start of its body as ``text``."""

    def __init__(self, status: int, body: bytes):
        self.status_code = status
        self.text = body[:1000].decode("utf-8", "replace")


def _post_pinned(url: str, address: str, *, data: bytes, headers: dict, timeout: float):
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            address,
            port,
            server_hostname=parts.hostname,
            assert_hostname=parts.hostname,
            cert_reqs="CERT_REQUIRED",
            ca_certs=certifi.where(),
        )
    else:
        pool = urllib3.HTTPConnectionPool(address, port)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    with pool:
        return pool.urlopen(
            "POST",
            target,
            body=data,
            headers={**headers, "Host": parts.netloc.rpartition("@")[2]},
            redirect=False,
            retries=False,
            timeout=urllib3.Timeout(total=timeout),
            preload_content=True,
        )


def post_guarded(url: str, *, data: bytes, headers: dict, timeout: float) -> Answer:
    """POST ``data`` to ``url``, following up to ``MAX_REDIRECTS`` redirects, each target checked first and
    connected to at the checked address.

    Raises ``UrlRefused`` for a refused URL (first or redirected) and
    ``OSError`` or ``urllib3.exceptions.HTTPError`` for a network error;
    returns the last answer (any status).
    """
    for _ in range(MAX_REDIRECTS + 1):
        response = _post_pinned(url, check_url(url), data=data, headers=headers, timeout=timeout)
        location = response.headers.get("Location")
        if response.status not in (301, 302, 303, 307, 308) or not location:
            return Answer(response.status, response.data)
        url = urljoin(url, location)
    raise UrlRefused(f"more than {MAX_REDIRECTS} redirects.")
