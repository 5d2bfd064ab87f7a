"""Company sign-in against a real OpenID provider (docs/deploy.md#single-sign-on): django-oauth-toolkit's provider
runs as its own Django project (``tests/oidc_provider``) in its own process; a browser signs in through it, the
user is made with the Project role its ``groups`` claim maps to, signs out, and the role follows the claim at the
next sign-in. ID tokens with a bad signature, another audience, an expired time, a replayed nonce or a state the
session does not hold are refused.
"""

import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings as django_settings
from django.core.exceptions import SuspiciousOperation
from playwright.sync_api import expect

from runs.models import Membership, Project, Role
from runs.oidc import MadoOIDCBackend
from tests.factories import UserFactory
from tests.oidc_provider.process import CLIENT_ID, _pem, provider, sso  # noqa: F401 - the fixtures


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
    lead = UserFactory(username="lead")  # vision's other admin: the claim may take yuki's admin role away
    Membership.objects.create(user=lead, project=Project.objects.get(slug="vision"), role=Role.ADMIN)
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
def test_a_callback_with_a_state_the_session_does_not_hold_is_refused_on_the_login_page(sso, client):
    session = client.session
    session["oidc_states"] = {"state-1": {"nonce": "n-1", "code_verifier": "v", "added_on": time.time()}}
    session.save()
    response = client.get("/oidc/callback/", {"code": "c", "state": "state-2"}, follow=True)
    assert response.redirect_chain[-1][0].startswith("/accounts/login/")
    assert "Single sign-on refused: OIDC callback state not found" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_a_provider_that_answers_with_an_error_ends_on_the_login_page_with_it(sso, client):
    response = client.get("/oidc/callback/", {"error": "access_denied", "state": "s"}, follow=True)
    assert response.redirect_chain[-1][0].startswith("/accounts/login/")
    assert "Single sign-on refused: the provider answered &#x27;access_denied&#x27;" in response.content.decode()
