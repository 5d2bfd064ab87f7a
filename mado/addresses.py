"""The address a request came from (docs/deploy.md#trusted-proxies), for the audit log, throttled sign-ins and a
token's last use.

``REMOTE_ADDR`` unless it is one of the operator's trusted proxies
(``MADO_TRUSTED_PROXIES``, addresses or networks): then ``X-Forwarded-For``
is read from its right end, skipping the trusted proxies, and the first
address no trusted proxy vouches for is the client. A client can put anything
at the left of the header, so nothing left of that point is believed, and
without trusted proxies the header is never read.
"""

import ipaddress

from django.conf import settings


def _address(text: str):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address) -> bool:
    return any(address in network for network in settings.MADO_TRUSTED_PROXIES)


def client_address(request) -> str | None:
    """The client's address as text (see above); None without a request or a usable ``REMOTE_ADDR``."""
    if request is None:
        return None
    address = _address(request.META.get("REMOTE_ADDR") or "")
    if address is None:
        return None
    if not _trusted(address):
        return str(address)
    for hop in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        forwarded = _address(hop)
        if forwarded is None:
            break  # a hop that is no address: believe nothing further left
        address = forwarded
        if not _trusted(forwarded):
            break
    return str(address)
