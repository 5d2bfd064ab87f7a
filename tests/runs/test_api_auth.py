"""API authentication, the JSON error shape, the schema pages and ``manage.py mado_token`` (docs/api.md)."""

import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from mado.models import ApiToken
from tests.factories import UserFactory, api_key


def client_with(header: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


@pytest.mark.parametrize("keyword", ["Bearer", "Token", "bearer"])
def test_a_token_is_accepted_with_the_bearer_and_token_keywords(viewer, project, keyword):
    key = api_key(viewer)
    response = client_with(f"{keyword} {key}").get("/api/v1/projects/")
    assert response.status_code == 200 and response.json()["count"] == 1


@pytest.mark.parametrize("header", ["Bearer wrong-token", "Bearer", "Bearer a b", "Token "])
def test_a_wrong_or_malformed_token_is_refused_with_401(viewer, header):
    api_key(viewer)
    response = client_with(header).get("/api/v1/projects/")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert response["WWW-Authenticate"] == "Bearer"


def test_an_inactive_users_token_is_refused(viewer):
    key = api_key(viewer)
    viewer.is_active = False
    viewer.save()
    assert client_with(f"Bearer {key}").get("/api/v1/projects/").status_code == 401


def test_anonymous_gets_a_json_401(db):
    response = APIClient().get("/api/v1/runs/")
    assert response.status_code == 401
    assert response.json() == {"error": "unauthenticated", "detail": response.json()["detail"], "field": None}


def test_a_logged_in_browser_session_is_accepted(client, viewer, project):
    client.force_login(viewer)
    assert client.get("/api/v1/projects/").status_code == 200


@pytest.mark.parametrize(
    "call, status, code",
    [
        (lambda c, run: c.get("/api/v1/runs/987654/"), 404, "not_found"),
        (lambda c, run: c.post("/api/v1/runs/", {"project": "vision", "kind": "x"}, format="json"), 400, "invalid"),
        (lambda c, run: c.patch(f"/api/v1/runs/{run.pk}/", {"status": "finished"}, format="json"), 403, "forbidden"),
    ],
)
def test_every_error_has_the_json_shape_error_detail_field(api, viewer, run, call, status, code):
    response = call(api(viewer), run)
    assert response.status_code == status and response["Content-Type"] == "application/json"
    assert response.json()["error"] == code
    assert isinstance(response.json()["detail"], str) and "field" in response.json()


def test_the_schema_and_docs_are_served(api, viewer):
    client = api(viewer)
    schema = client.get("/api/v1/schema/")
    assert schema.status_code == 200 and b"/api/v1/runs/{run_id}/metrics/" in schema.content
    assert client.get("/api/v1/docs/").status_code == 200


# --- manage.py mado_token ---------------------------------------------------------------


def test_mado_token_creates_and_prints_a_token_that_authenticates(db, project):
    UserFactory(username="trainer")
    out = io.StringIO()
    call_command("mado_token", "trainer", "--name", "laptop", "--scope", "read", stdout=out)
    key = out.getvalue().strip()
    token = ApiToken.objects.get(user__username="trainer")
    assert (token.name, token.scope) == ("laptop", "read") and key not in (token.prefix, token.digest)
    assert client_with(f"Bearer {key}").get("/api/v1/projects/").status_code == 200


def test_mado_token_makes_a_new_token_each_time(db):
    UserFactory(username="trainer")
    first, second = io.StringIO(), io.StringIO()
    call_command("mado_token", "trainer", stdout=first)
    call_command("mado_token", "trainer", stdout=second)
    assert first.getvalue() != second.getvalue() and ApiToken.objects.count() == 2


def test_mado_token_refuses_a_lifetime_beyond_the_maximum(db, settings):
    UserFactory(username="trainer")
    with pytest.raises(CommandError, match="expires_in_days"):
        call_command("mado_token", "trainer", "--days", str(settings.MADO_TOKEN_MAX_DAYS + 1))
    assert not ApiToken.objects.exists()


def test_mado_token_refuses_an_unknown_user(db):
    with pytest.raises(CommandError, match="ghost"):
        call_command("mado_token", "ghost")
    assert not ApiToken.objects.exists()
