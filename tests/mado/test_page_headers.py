"""Both browser policies on every response (docs/design/interfaces.md#page-security): pages, API answers, static
files, a redirect, a 404, and what the operator endpoints answer before the rest of the stack. Chromium's verdict
on the pages is tests/e2e/test_page_policies.py's."""

import pytest
from django.test import Client

from mado.page_headers import permissions_policy

pytestmark = pytest.mark.django_db


def test_every_kind_of_response_carries_the_content_security_policy_and_the_permissions_policy(creator):
    client = Client()
    client.force_login(creator)
    for path in ["/accounts/login/", "/", "/api/v1/projects/", "/static/mado.css", "/no-such-page/", "/healthz"]:
        response = client.get(path)
        assert response.status_code in (200, 302, 404), path  # the login page redirects a signed-in user
        policy = response["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "script-src 'self'" in policy and "style-src 'self'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
        for feature in ("camera", "microphone", "geolocation", "payment", "usb"):
            assert f"{feature}=()" in response["Permissions-Policy"], path


def test_the_permissions_policy_refuses_each_feature_to_every_origin():
    assert permissions_policy(["camera", "usb"]) == "camera=(), usb=()"
