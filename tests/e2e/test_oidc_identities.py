"""Nobody signs in as someone else (docs/deploy.md#single-sign-on): against the real test provider, each sign-in is
the user bound to the provider's ``(issuer, subject)``. A provider account calling itself ``root``, a service
account's name, or a local user's name gets a new user of its own; an unverified e-mail links to nobody; a known
subject stays its user under a new name; and each misbehaving answer (userinfo of another subject, another
authorized party, an ID token issued in the future or not yet valid, an unsigned one, a failing token endpoint) is
refused on the login page with its reason and an audit record, signing nobody in."""

import html
import os
import re
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model

from mado.models import AuditEvent
from runs.identities import identity_link, identity_unlink
from runs.models import ExternalIdentity, IdentityLink, Membership, Role
from runs.service_accounts import service_account_create
from tests.factories import ProjectFactory, UserFactory
from tests.oidc_provider.process import (  # noqa: F401 - the fixtures
    ROOT,
    provider,
    sign_in_over_http,
    signed_in_as,
    sso,
)

pytestmark = [pytest.mark.django_db(transaction=True)]
User = get_user_model()


def _sign_in(live_server, sso, username: str, *, link=True):
    if link:
        sso.add_client_and_user(f"{live_server.url}/oidc/callback/", username)
    return sign_in_over_http(live_server.url, username)


def _signed_in(client, live_server) -> str | None:
    """Who mado's session cookie in ``client`` is, asked afresh (None: no session signs in)."""
    return signed_in_as(client.get(f"{live_server.url}/", timeout=30))


def test_a_provider_account_named_like_a_local_superuser_gets_a_new_user_of_its_own(live_server, sso):
    root = User.objects.create_superuser("root", email="root@mado.example", password="local-root-pw")
    client, page = _sign_in(live_server, sso, "root")
    assert signed_in_as(page) == "root-2"
    root.refresh_from_db()
    assert (root.email, root.check_password("local-root-pw")) == ("root@mado.example", True)
    assert not ExternalIdentity.objects.filter(user=root).exists()
    created = AuditEvent.objects.get(action="identity.link")
    assert created.changes == {"user": [None, "root-2"], "linked_by": [None, IdentityLink.SIGN_UP]}


def test_a_provider_account_named_like_a_service_account_or_a_member_reaches_neither(live_server, sso):
    project = ProjectFactory(slug="ops")
    admin = UserFactory(username="alice")
    Membership.objects.create(user=admin, project=project, role=Role.ADMIN)
    service_account_create(actor=admin, project=project, name="ci")
    _client, page = _sign_in(live_server, sso, "ops.ci")
    assert signed_in_as(page) == "ops-ci"  # a service account's form is never handed out (runs.identities)
    _client, page = _sign_in(live_server, sso, "alice")
    assert signed_in_as(page) == "alice-2"
    assert Membership.objects.get(user=admin, project=project).role == Role.ADMIN


def test_an_unverified_email_links_to_nobody_and_a_verified_one_links_only_when_allowed(live_server, sso, settings):
    settings.MADO_OIDC_LINK_VERIFIED_EMAIL = True
    ops = UserFactory(username="ops", email="ops@example.com")
    sso.set_claims({"mallory": {"claims": {"email": "ops@example.com", "email_verified": False}}})
    _client, page = _sign_in(live_server, sso, "mallory")
    assert signed_in_as(page) == "mallory"
    ops.refresh_from_db()
    assert ops.email == "ops@example.com" and not ops.external_identities.exists()
    assert User.objects.get(username="mallory").email == ""  # an unverified address is not kept

    User.objects.create_superuser("boss", email="boss@example.com", password="pw")
    sso.set_claims({"eve": {"claims": {"email": "boss@example.com", "email_verified": True}}})
    _client, page = _sign_in(live_server, sso, "eve")
    assert signed_in_as(page) == "eve"  # never a superuser, verified or not

    sso.set_claims({"opsperson": {"claims": {"email": "OPS@example.com", "email_verified": True}}})
    _client, page = _sign_in(live_server, sso, "opsperson")
    assert signed_in_as(page) == "ops"
    linked = AuditEvent.objects.filter(action="identity.link").latest("id")
    assert linked.changes == {"user": [None, "ops"], "linked_by": [None, IdentityLink.VERIFIED_EMAIL]}


def test_linking_by_verified_email_is_off_unless_the_operator_turns_it_on(live_server, sso):
    UserFactory(username="ops", email="ops@example.com")
    sso.set_claims({"opsperson": {"claims": {"email": "ops@example.com", "email_verified": True}}})
    _client, page = _sign_in(live_server, sso, "opsperson")
    assert signed_in_as(page) == "opsperson"


def test_a_known_subject_stays_its_user_whatever_name_or_email_it_claims_next(live_server, sso):
    UserFactory(username="root", is_superuser=True)
    _client, page = _sign_in(live_server, sso, "yuki")
    assert signed_in_as(page) == "yuki"
    sso.set_claims({"yuki": {"claims": {"preferred_username": "root", "email": "root@example.com"}}})
    client, page = _sign_in(live_server, sso, "yuki", link=False)
    assert signed_in_as(page) == "yuki" and _signed_in(client, live_server) == "yuki"
    assert ExternalIdentity.objects.get().user.username == "yuki"


def test_an_admin_binds_a_subject_to_a_superuser_by_hand_and_only_then_it_signs_in_as_them(live_server, sso):
    root = User.objects.create_superuser("root", password="pw")
    _client, page = _sign_in(live_server, sso, "root")
    assert signed_in_as(page) == "root-2"
    identity = ExternalIdentity.objects.get()
    identity_unlink(actor=root, identity=identity)
    identity_link(actor=root, user=root, issuer=identity.issuer, subject=identity.subject)
    client, page = _sign_in(live_server, sso, "root", link=False)
    assert signed_in_as(page) == "root" and _signed_in(client, live_server) == "root"
    assert [e.action for e in AuditEvent.objects.filter(actor_name="root").order_by("id")][:2] == [
        "identity.unlink",
        "identity.link",
    ]


def _refused(live_server, sso, changes: dict, reason: str) -> None:
    sso.set_claims({"yuki": changes})
    client, page = _sign_in(live_server, sso, "yuki")
    assert page.status_code == 200 and "/accounts/login/" in page.url, page.url
    shown = re.findall(r'class="message[^"]*">([^<]*)<', html.unescape(page.text))
    assert any(message.startswith(f"Single sign-on refused: {reason}") for message in shown), shown
    assert signed_in_as(page) is None and _signed_in(client, live_server) is None
    failed = AuditEvent.objects.get(action="auth.sign_in_failed")
    assert failed.changes["method"] == [None, "oidc"] and reason in failed.changes["result"][1]
    assert not AuditEvent.objects.filter(action="auth.sign_in").exists()


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"userinfo": {"sub": "someone-else"}}, "the provider's userinfo names another subject"),
        ({"id_token": {"azp": "another-client"}}, "the ID token was issued to another client (azp)"),
        ({"id_token": {"iat": int(time.time()) + 3600}}, "the ID token was issued in the future (iat)"),
        ({"id_token": {"nbf": int(time.time()) + 3600}}, "the ID token is not valid yet (nbf)"),
        ({"alg": "none"}, "the ID token is not signed with RS256 (alg 'none')"),
    ],
    ids=["userinfo-sub", "azp", "future-iat", "early-nbf", "alg-none"],
)
def test_a_misbehaving_provider_answer_is_refused_on_the_login_page(live_server, sso, changes, reason):
    _refused(live_server, sso, changes, reason)
    assert not User.objects.filter(username="yuki").exists()


def test_a_failing_token_endpoint_is_refused_on_the_login_page(live_server, sso, settings):
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{sso.url}/o/no-such-endpoint/"
    _refused(live_server, sso, {}, "the identity provider did not answer as expected")


def test_a_sign_in_is_audited_with_its_method_and_address(live_server, sso):
    _client, page = _sign_in(live_server, sso, "yuki")
    assert signed_in_as(page) == "yuki"
    record = AuditEvent.objects.get(action="auth.sign_in")
    assert (record.actor_name, record.changes["method"], record.address) == ("yuki", [None, "oidc"], "127.0.0.1")


def test_role_sync_never_removes_a_projects_last_admin(live_server, sso):
    sso.set_groups("yuki", ["ml-leads"])
    _client, page = _sign_in(live_server, sso, "yuki")
    assert Membership.objects.get(user__username="yuki", project__slug="vision").role == Role.ADMIN
    sso.set_groups("yuki", [])
    _client, page = _sign_in(live_server, sso, "yuki", link=False)
    assert signed_in_as(page) == "yuki"
    assert Membership.objects.get(user__username="yuki", project__slug="vision").role == Role.ADMIN
    assert not Membership.objects.filter(user__username="yuki", project__slug="nlp").exists()  # a viewer follows
    kept = AuditEvent.objects.get(action="membership.keep_last_admin")
    assert kept.changes == {"role": [Role.ADMIN, None]}


def test_sign_on_without_an_issuer_refuses_to_start():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "MADO_DEBUG": "1",
        "MADO_OIDC_CLIENT_ID": "mado",
        "MADO_OIDC_ISSUER": "",
    }
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert started.returncode != 0
    assert "MADO_OIDC_ISSUER must be set when MADO_OIDC_CLIENT_ID is" in started.stderr
