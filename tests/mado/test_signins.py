"""Sign-ins audited and throttled (docs/deploy.md#sign-in-throttling): wrong passwords on the form and on HTTP
Basic lock the account name and the address out, the right password included, while its tokens keep working;
every attempt is an audit record; the window's end or an operator's reset unlocks; behind a trusted proxy the
client's address is the one recorded and locked out, and a client cannot choose it without one."""

import base64
import datetime
import ipaddress

import pytest
from axes.models import AccessAttempt
from django.core.cache import cache
from django.core.management import call_command

from mado.models import AuditEvent
from mado.tokens import api_token_create
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
LIMIT = 5  # MADO_LOGIN_FAILURE_LIMIT's default


def _form(client, username: str, password: str, **extra):
    return client.post("/accounts/login/", {"username": username, "password": password}, **extra)


def _basic(client, username: str, password: str, **extra):
    secret = base64.b64encode(f"{username}:{password}".encode()).decode()
    return client.get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Basic {secret}", **extra)


def _failures() -> list[tuple[str, str, str]]:
    return [
        (e.object_repr, e.changes["method"][1], e.changes["result"][1])
        for e in AuditEvent.objects.filter(action="auth.sign_in_failed").order_by("id")
    ]


def test_wrong_passwords_on_the_form_lock_the_account_out_and_every_attempt_is_audited(client):
    UserFactory(username="ana", password="right-password")
    for _attempt in range(LIMIT - 1):
        assert _form(client, "ana", "guess").status_code == 200  # the form again, with its error
    locked = _form(client, "ana", "guess", follow=True)
    assert "Too many failed sign-in attempts" in locked.content.decode()
    refused = _form(client, "ana", "right-password", follow=True)
    assert "_auth_user_id" not in client.session and "Too many failed sign-in attempts" in refused.content.decode()
    failures = _failures()
    assert len(failures) == LIMIT + 1 and {(name, method) for name, method, _ in failures} == {("ana", "password")}
    assert failures[0][2] == "wrong user name or password"
    assert failures[-1][2] == "locked out: too many failed attempts"
    assert not AuditEvent.objects.filter(action="auth.sign_in").exists()


def test_wrong_basic_passwords_answer_429_then_and_the_accounts_tokens_keep_working(client):
    ana = UserFactory(username="ana", password="right-password")
    _token, key = api_token_create(user=ana, name="ci")
    answers = [_basic(client, "ana", "guess").status_code for _attempt in range(LIMIT)]
    assert answers == [401] * (LIMIT - 1) + [429]
    locked = _basic(client, "ana", "right-password")
    assert locked.status_code == 429 and int(locked["Retry-After"]) > 0
    assert "Tokens keep working" in locked.json()["detail"]
    assert client.get("/api/v1/projects/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    assert _basic(client, "ana", key).status_code == 200  # a token as the Basic password is a token too
    assert {method for _name, method, _result in _failures()} == {"basic"} and len(_failures()) == LIMIT + 1


def test_the_window_passing_or_an_operators_reset_unlocks(client):
    UserFactory(username="ana", password="right-password")
    for _attempt in range(LIMIT):
        _basic(client, "ana", "guess")
    assert _basic(client, "ana", "right-password").status_code == 429
    AccessAttempt.objects.update(attempt_time=datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1))
    assert _basic(client, "ana", "right-password").status_code == 200

    for _attempt in range(LIMIT):
        _basic(client, "ana", "guess")
    assert _basic(client, "ana", "right-password").status_code == 429
    call_command("axes_reset_username", "ana")
    call_command("axes_reset_ip", "127.0.0.1")
    assert _basic(client, "ana", "right-password").status_code == 200


def test_one_address_guessing_many_accounts_is_locked_out_for_all_of_them(client):
    UserFactory(username="ana", password="right-password")
    for number in range(LIMIT):
        _basic(client, f"someone-{number}", "guess")
    assert _basic(client, "ana", "right-password").status_code == 429
    other_address = _basic(client, "ana", "right-password", REMOTE_ADDR="192.0.2.7")
    assert other_address.status_code == 200


def test_a_sign_in_is_audited_once_and_basic_once_an_hour(client):
    cache.clear()  # the once-an-hour marks of earlier tests' users (their ids come again in a new test)
    UserFactory(username="ana", password="right-password")
    assert _form(client, "ana", "right-password").status_code == 302
    for _request in range(3):
        assert _basic(client, "ana", "right-password").status_code == 200
    records = AuditEvent.objects.filter(action="auth.sign_in").order_by("id")
    assert [(e.actor_name, e.changes["method"][1], e.address) for e in records] == [
        ("ana", "password", "127.0.0.1"),
        ("ana", "basic", "127.0.0.1"),
    ]


def test_forwarded_addresses_are_read_only_from_a_trusted_proxy(client, settings):
    UserFactory(username="ana", password="right-password")
    _form(client, "ana", "guess", HTTP_X_FORWARDED_FOR="203.0.113.9")
    settings.MADO_TRUSTED_PROXIES = (ipaddress.ip_network("127.0.0.0/8"),)
    _form(client, "ana", "guess", HTTP_X_FORWARDED_FOR="198.51.100.1, 203.0.113.9, 127.0.0.2")
    _form(client, "ana", "guess", HTTP_X_FORWARDED_FOR="not-an-address")
    addresses = list(
        AuditEvent.objects.filter(action="auth.sign_in_failed").order_by("id").values_list("address", flat=True)
    )
    assert addresses == ["127.0.0.1", "203.0.113.9", "127.0.0.1"]
