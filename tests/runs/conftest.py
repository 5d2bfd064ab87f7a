"""Fixtures for the API tests of this folder (issue 2 part 4).

``client_as(role)`` is an API client for one of the shared role fixtures
(``admin``, ``member``, ``creator``, ``viewer``, ``outsider``) or
``"anonymous"``. Passwords use a fast hasher: the default PBKDF2 costs about
0.5 s per user and every test creates several.
"""

import pytest


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def client_as(request, api):
    def make(role):
        return api(None if role == "anonymous" else request.getfixturevalue(role))

    return make
