"""Webhook URLs cannot be pointed inward (docs/design/alerts.md#ssrf).

A URL is refused when its host resolves to any loopback, private,
link-local (the cloud metadata address 169.254.169.254 among them),
carrier-grade NAT, multicast, reserved or unspecified address, unless the
operator opened that range in ``MADO_ALERT_WEBHOOK_ALLOW`` (CIDRs). The check
runs when a channel is created and again before every request of a
delivery, after every redirect (``post_guarded`` follows redirects itself).
"""

import ipaddress
import socket
from urllib.parse import urljoin, urlsplit

import requests
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


def check_url(url: str) -> None:
    """Raise ``UrlRefused`` unless ``url`` is http(s) and every address its host resolves to is outward (or allowed).

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


def post_guarded(url: str, *, data: bytes, headers: dict, timeout: float) -> requests.Response:
    """POST ``data`` to ``url``, following up to ``MAX_REDIRECTS`` redirects, each target checked first.

    Raises ``UrlRefused`` for a refused URL (first or redirected) and
    ``requests.RequestException`` for a network error; returns the last
    response (any status).
    """
    for _ in range(MAX_REDIRECTS + 1):
        check_url(url)
        response = requests.post(url, data=data, headers=headers, timeout=timeout, allow_redirects=False)
        if not response.is_redirect:
            return response
        url = urljoin(url, response.headers["Location"])
    raise UrlRefused(f"more than {MAX_REDIRECTS} redirects.")
