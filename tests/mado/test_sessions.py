"""Page sessions (docs/design/interfaces.md#page-security; mado/sessions.py): a dump of the whole database taken while
someone is signed in holds nothing that signs in as a session cookie; signing out ends the session for every copy
of its cookie; the rows written before digests are forgotten by the migration and never signed anyone in again;
the async paths store, find and delete the digest as the others do."""

import importlib

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.sessions.backends import db as django_db_sessions
from django.contrib.sessions.middleware import SessionMiddleware
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client, RequestFactory

from mado.sessions import SessionStore, stored_key
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
SIGNED_IN_PAGE = "/accounts/tokens/"  # a signed-in user's page: 200, or a redirect to the login page


def _sign_in(client: Client, username: str) -> str:
    """Sign in through the login form; the session cookie's value."""
    UserFactory(username=username)
    response = client.post("/accounts/login/", {"username": username, "password": "pw-123456"})
    assert response.status_code == 302 and response.url == "/"
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def _cookie_signs_in(value: str) -> bool:
    """Whether ``value``, sent as the session cookie, is a signed-in user: what the session and authentication
    middleware make of it, without the rest of a request."""
    request = RequestFactory().get(SIGNED_IN_PAGE)
    request.COOKIES[settings.SESSION_COOKIE_NAME] = value
    SessionMiddleware(lambda request: None).process_request(request)
    return get_user(request).is_authenticated


def _page_signs_in(value: str) -> bool:
    client = Client()
    client.cookies[settings.SESSION_COOKIE_NAME] = value
    return client.get(SIGNED_IN_PAGE).status_code == 200


def _dump() -> set[str]:
    """Every value in every row of every table, as text (binary values also as hex)."""
    values = set()
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        raw = bytes(value)
                        values.update({raw.hex(), raw.decode("utf-8", "replace")})
                    elif value is not None:
                        values.add(str(value))
    return values


def test_a_dump_of_every_table_taken_while_signed_in_holds_no_value_that_signs_in(client):
    cookie = _sign_in(client, "dora")
    assert _cookie_signs_in(cookie) and _page_signs_in(cookie)  # the premise: the checks see a signed-in cookie
    dump = _dump()
    assert cookie not in dump
    assert stored_key(cookie) in dump  # the row is in the dump, under its digest
    assert [value for value in dump if _cookie_signs_in(value)] == []
    # The session table's own values, through the whole page stack too.
    rows = Session.objects.values_list("session_key", "session_data")
    assert rows and not any(_page_signs_in(value) for row in rows for value in row)
    assert client.get(SIGNED_IN_PAGE).status_code == 200  # still signed in: the dump took nothing away


def test_signing_out_ends_the_session_for_every_copy_of_its_cookie(client):
    cookie = _sign_in(client, "dora")
    copy = Client()
    copy.cookies[settings.SESSION_COOKIE_NAME] = cookie
    assert copy.get(SIGNED_IN_PAGE).status_code == 200
    client.post("/accounts/logout/")
    assert copy.get(SIGNED_IN_PAGE).status_code == 302
    assert not Session.objects.filter(session_key=stored_key(cookie)).exists()


def test_signing_in_replaces_the_anonymous_session_and_its_row(client):
    anonymous = client.session  # an anonymous session with something in it, as the OpenID sign-in keeps its state
    anonymous["oidc_states"] = {"state": {"nonce": "n", "code_verifier": "v"}}
    anonymous.save()
    before = anonymous.session_key
    cookie = _sign_in(client, "dora")
    assert cookie != before
    assert list(Session.objects.values_list("session_key", flat=True)) == [stored_key(cookie)]


def test_the_migration_forgets_the_sessions_stored_under_their_key_and_keeps_the_others(client):
    user = UserFactory(username="old")
    legacy = django_db_sessions.SessionStore()  # Django's backend: the row under the key itself
    legacy.update(
        {
            "_auth_user_id": str(user.pk),
            "_auth_user_backend": "django.contrib.auth.backends.ModelBackend",
            "_auth_user_hash": user.get_session_auth_hash(),
        }
    )
    legacy.create()
    assert Session.objects.filter(session_key=legacy.session_key).exists()
    assert not _cookie_signs_in(legacy.session_key)  # never found under a digest
    cookie = _sign_in(client, "dora")

    migration = importlib.import_module("mado.migrations.0006_sessions_stored_as_digests")
    migration.forget_clear_keys(apps, None)

    assert list(Session.objects.values_list("session_key", flat=True)) == [stored_key(cookie)]
    assert client.get(SIGNED_IN_PAGE).status_code == 200


def test_the_async_paths_store_find_and_delete_the_digest_too():
    store = SessionStore()
    store["theme"] = "dark"
    async_to_sync(store.acreate)()
    async_to_sync(store.asave)()
    key = store.session_key
    assert list(Session.objects.values_list("session_key", flat=True)) == [stored_key(key)]
    assert async_to_sync(SessionStore().aexists)(key)
    assert async_to_sync(SessionStore(key).aget)("theme") == "dark"
    async_to_sync(SessionStore(key).adelete)()
    assert not Session.objects.exists()
