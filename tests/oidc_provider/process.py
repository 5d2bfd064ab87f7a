"""The test OpenID provider as a running process (``Provider``), the ``provider`` and ``sso`` fixtures that start it
and point mado at it, and ``sign_in_over_http``: the authorization code flow walked by a plain HTTP client, as a
browser would, for the tests that need the protocol, not the pages."""

import html
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwcrypto import jwk, jwt

from tests.factories import ProjectFactory

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID, SECRET = "mado-client", "mado-client-secret"
PASSWORD = "idp-password"  # every provider user's
RULES = ["ml-team=vision:member", "ml-leads=vision:admin", "ml-leads=nlp:viewer"]


def _pem(key) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Provider:
    """The provider process, its URL and signing key, and a way to set the user's groups there."""

    def __init__(self, folder: Path):
        self.key_pem = _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
        (folder / "key.pem").write_text(self.key_pem)
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
            "OIDC_PROVIDER_DB": str(folder / "provider.sqlite3"),
            "OIDC_PROVIDER_KEY_FILE": str(folder / "key.pem"),
            "OIDC_PROVIDER_GROUPS_FILE": str(folder / "groups.json"),
            "OIDC_PROVIDER_CLAIMS_FILE": str(folder / "claims.json"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        subprocess.run([sys.executable, "-m", "django", "migrate", "--noinput"], env=self.env, check=True, cwd=ROOT)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.discovery = self._wait_until_up()

    def _wait_until_up(self) -> dict:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/o/.well-known/openid-configuration") as response:
                    return json.load(response)
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("the OpenID provider did not start") from None
                time.sleep(0.3)

    def add_client_and_user(self, redirect_uri: str, username: str) -> None:
        command = [sys.executable, "-m", "tests.oidc_provider.world", CLIENT_ID, SECRET, redirect_uri, username]
        subprocess.run(command, env=self.env, check=True, cwd=ROOT)

    def set_groups(self, username: str, groups: list[str]) -> None:
        """The ``groups`` claim the provider gives ``username`` from the next sign-in on."""
        Path(self.env["OIDC_PROVIDER_GROUPS_FILE"]).write_text(json.dumps({username: groups}))

    def set_claims(self, changes: dict[str, dict]) -> None:
        """``{username: {"claims": …, "id_token": …, "userinfo": …, "alg": "none"}}`` from the next sign-in on
        (``tests.oidc_provider.validator``); ``{}``: the provider behaves."""
        Path(self.env["OIDC_PROVIDER_CLAIMS_FILE"]).write_text(json.dumps(changes))

    def sign(self, claims: dict, *, key_pem: str | None = None) -> str:
        """An ID token with ``claims``, signed with the provider's key (or ``key_pem``) under the provider's kid."""
        provider_key = jwk.JWK.from_pem(self.key_pem.encode())
        signing = jwk.JWK.from_pem((key_pem or self.key_pem).encode())
        token = jwt.JWT(header={"alg": "RS256", "kid": provider_key.thumbprint()}, claims=claims)
        token.make_signed_token(signing)
        return token.serialize()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    running = Provider(tmp_path_factory.mktemp("oidc-provider"))
    yield running
    running.stop()


@pytest.fixture
def sso(settings, provider, live_server):
    """mado configured for ``provider`` (behaving: no claim changes); the provider's user ``yuki`` in group
    ``ml-team``; Projects ``vision`` and ``nlp``."""
    endpoints = provider.discovery
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = CLIENT_ID, SECRET
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = endpoints["authorization_endpoint"]
    settings.OIDC_OP_TOKEN_ENDPOINT = endpoints["token_endpoint"]
    settings.OIDC_OP_USER_ENDPOINT = endpoints["userinfo_endpoint"]
    settings.OIDC_OP_JWKS_ENDPOINT = endpoints["jwks_uri"]
    settings.MADO_OIDC_ISSUER = endpoints["issuer"]
    settings.MADO_OIDC_ENABLED, settings.MADO_OIDC_PROVIDER_NAME = True, "Example IdP"
    settings.MADO_OIDC_ROLE_RULES = RULES
    settings.AUTHENTICATION_BACKENDS = ["runs.oidc.MadoOIDCBackend", "django.contrib.auth.backends.ModelBackend"]
    provider.add_client_and_user(f"{live_server.url}/oidc/callback/", "yuki")
    provider.set_groups("yuki", ["ml-team"])
    provider.set_claims({})
    ProjectFactory(name="Vision", slug="vision")
    ProjectFactory(name="NLP", slug="nlp")
    return provider


def sign_in_over_http(base_url: str, username: str) -> tuple[requests.Session, requests.Response]:
    """Sign ``username`` in to mado at ``base_url`` through the provider: mado's sign-on link, the provider's
    password form, and every redirect after it. Returns the client (its cookies: mado's session, if any) and the
    last page: mado's home page when signed in, its login page with the reason when refused."""
    client = requests.Session()
    form = client.get(f"{base_url}/oidc/authenticate/", timeout=30)
    form.raise_for_status()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    next_url = html.unescape(re.search(r'name="next" value="([^"]*)"', form.text).group(1))
    answer = client.post(
        form.url,
        data={"csrfmiddlewaretoken": csrf, "username": username, "password": PASSWORD, "next": next_url},
        headers={"Referer": form.url},
        timeout=30,
    )
    return client, answer


def signed_in_as(page: requests.Response) -> str | None:
    """The user name mado's page shows as signed in, or None."""
    found = re.search(r'<a class="user"[^>]*>([^<]+)</a>', page.text)
    return found.group(1) if found else None
