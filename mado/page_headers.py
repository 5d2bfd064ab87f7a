"""The Permissions-Policy header on every response (docs/design/interfaces.md#page-security).

Django sets no Permissions-Policy and django-csp writes only the Content-Security-Policy; this middleware refuses
the browser features named in ``settings.MADO_PERMISSIONS_POLICY_OFF`` (camera, microphone, geolocation, payment,
USB, …) to every page and to any frame inside it.
"""

from django.conf import settings

HEADER = "Permissions-Policy"


def permissions_policy(features_off) -> str:
    """The header's value refusing each of ``features_off`` (names of policy-controlled features) to every origin:
    ``camera=(), microphone=()``."""
    return ", ".join(f"{feature}=()" for feature in features_off)


class PermissionsPolicyMiddleware:
    """Sets ``Permissions-Policy`` on each response that has none yet; the value is built once, at start."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.value = permissions_policy(settings.MADO_PERMISSIONS_POLICY_OFF)

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault(HEADER, self.value)
        return response
