"""Company sign-in against a real OpenID provider (docs/deploy.md#single-sign-on): django-oauth-toolkit's provider
runs as its own Django project (``tests/oidc_provider``) in its own process; a browser signs in through it, the
user is made with the Project role its ``groups`` claim maps to, signs out, and the role follows the claim at the
next sign-in. ID tokens with a bad signature, another audience, an expired time, a replayed nonce or a state the
session does not hold are refused.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings as django_settings
from django.core.exceptions import SuspiciousOperation
from jwcrypto import jwk, jwt
from playwright.sync_api import expect

from runs.models import Membership, Role
from runs.oidc import MadoOIDCBackend
from tests.factories import ProjectFactory

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID, SECRET = "mado-client", "mado-client-secret"
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
    """mado configured for ``provider``; the provider's user ``yuki`` in group ``ml-team``."""
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
    ProjectFactory(name="Vision", slug="vision")
    ProjectFactory(name="NLP", slug="nlp")
    return provider


def _role(project: str) -> str | None:
    return (
        Membership.objects.filter(user__username="yuki", project__slug=project).values_list("role", flat=True).first()
    )


def _sign_in(page, *, at_provider: bool) -> None:
    page.goto("/accounts/login/")
    page.locator("a.sso").click()
    if at_provider:
        page.locator("#id_username").fill("yuki")
        page.locator("#id_password").fill("idp-password")
        page.get_by_role("button", name="Sign in at the provider").click()
    expect(page.locator("a.user")).to_have_text("yuki", timeout=20_000)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_browser_signs_in_through_the_provider_gets_the_mapped_role_and_it_follows_the_claim(
    browser, live_server, sso
):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    callbacks = []
    page.on("request", lambda request: callbacks.append(request.url) if "/oidc/callback/" in request.url else None)
    try:
        page.goto("/accounts/login/")
        expect(page.locator("a.sso")).to_have_text("Sign in with Example IdP")
        folder = Path(django_settings.BASE_DIR) / "var" / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / "login-sso.png"))

        _sign_in(page, at_provider=True)
        assert (_role("vision"), _role("nlp")) == (Role.MEMBER, None)
        expect(page.get_by_role("link", name="Vision")).to_be_visible()
        page.locator("form.logout button").click()
        expect(page.locator("a.sso")).to_be_visible()

        sso.set_groups("yuki", ["ml-leads"])
        _sign_in(page, at_provider=False)  # the provider remembers the browser
        assert (_role("vision"), _role("nlp")) == (Role.ADMIN, Role.VIEWER)
        page.locator("form.logout button").click()

        sso.set_groups("yuki", [])
        _sign_in(page, at_provider=False)
        assert (_role("vision"), _role("nlp")) == (None, None)
        page.locator("form.logout button").click()

        # The provider's answer replayed (its code, state and nonce): the session holds that state no more.
        page.goto(callbacks[0])
        expect(page.locator("a.user")).to_have_count(0)
    finally:
        context.close()


# --- refusals: each check on its own, against the provider's real JWKS ------------------------------------------


def _claims(provider, **changes) -> dict:
    now = int(time.time())
    claims = {"iss": provider.discovery["issuer"], "aud": CLIENT_ID, "sub": "1", "iat": now, "exp": now + 300}
    return {**claims, "nonce": "n-1", **changes}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "case, changes, nonce",
    [
        ("a valid token", {}, "n-1"),
        ("another audience", {"aud": "someone-else"}, "n-1"),
        ("expired", {"exp": int(time.time()) - 3600}, "n-1"),
        ("a replayed nonce", {}, "n-0"),
        ("another issuer", {"iss": "https://evil.example.com"}, "n-1"),
    ],
)
def test_id_tokens_are_checked_for_audience_expiry_nonce_and_issuer(sso, case, changes, nonce):
    token = sso.sign(_claims(sso, **changes))
    if case == "a valid token":
        assert MadoOIDCBackend().verify_token(token, nonce=nonce)["sub"] == "1"
        return
    with pytest.raises(SuspiciousOperation):
        MadoOIDCBackend().verify_token(token, nonce=nonce)


@pytest.mark.django_db
def test_a_token_signed_with_another_key_is_refused(sso):
    forged = _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with pytest.raises(SuspiciousOperation, match="verification failed"):
        MadoOIDCBackend().verify_token(sso.sign(_claims(sso), key_pem=forged), nonce="n-1")


@pytest.mark.django_db
def test_a_callback_with_a_state_the_session_does_not_hold_is_refused(sso, client):
    session = client.session
    session["oidc_states"] = {"state-1": {"nonce": "n-1", "code_verifier": "v", "added_on": time.time()}}
    session.save()
    response = client.get("/oidc/callback/", {"code": "c", "state": "state-2"})
    assert response.status_code == 400 and "_auth_user_id" not in client.session
