"""Service accounts (docs/api.md#service-accounts): made by Project admins, act in their Project alone with their
role through the tokens admins make, never sign in interactively, and appear as such in the audit log."""

import base64

import pytest
from rest_framework.test import APIClient

from mado.models import AuditEvent
from runs.models import Project, ServiceAccount
from tests.factories import api_key


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def bot_key(admin, project) -> str:
    client = bearer(api_key(admin))
    made = client.post(
        f"/api/v1/projects/{project.slug}/service-accounts/", {"name": "ci", "role": "member"}, format="json"
    )
    assert made.status_code == 201 and made.json()["username"] == f"{project.slug}.ci"
    token = client.post(
        f"/api/v1/projects/{project.slug}/service-accounts/ci/tokens/", {"name": "pipeline"}, format="json"
    )
    assert token.status_code == 201
    return token.json()["key"]


def test_a_service_account_acts_in_its_project_with_its_role_and_is_audited_as_such(bot_key, project, other_project):
    bot = bearer(bot_key)
    run = bot.post("/api/v1/runs/", {"project": project.slug, "name": "nightly"}, format="json")
    assert run.status_code == 201
    assert bot.patch(f"/api/v1/runs/{run.json()['id']}/", {"status": "finished"}, format="json").status_code == 200
    event = AuditEvent.objects.get(action="run.end")
    assert (event.actor_kind, event.actor_name) == ("service_account", f"{project.slug}.ci")
    assert bot.get(f"/api/v1/projects/{other_project.slug}/").status_code == 404
    assert bot.get(f"/api/v1/projects/{project.slug}/members/").status_code == 200  # a member reads


def test_a_service_account_never_signs_in_interactively_nor_manages_its_own_tokens(bot_key, project, client):
    user = ServiceAccount.objects.get().user
    assert not user.has_usable_password()
    assert client.post("/accounts/login/", {"username": user.username, "password": ""}).status_code == 200
    assert "_auth_user_id" not in client.session
    basic = APIClient()
    basic.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{user.username}:x".encode()).decode())
    assert basic.get("/api/v1/projects/").status_code == 401
    assert bearer(bot_key).post("/api/v1/tokens/", {"name": "more", "scope": "admin"}, format="json").status_code == 403


def test_only_admins_make_service_accounts_and_one_cannot_join_another_project(
    bot_key, project, other_project, member, outsider
):
    refused = bearer(api_key(member)).post(
        f"/api/v1/projects/{project.slug}/service-accounts/", {"name": "mine"}, format="json"
    )
    assert refused.status_code == 403
    joined = bearer(api_key(outsider)).post(
        f"/api/v1/projects/{other_project.slug}/members/",
        {"username": f"{project.slug}.ci", "role": "viewer"},
        format="json",
    )
    assert (joined.status_code, joined.json()["field"]) == (400, "username")


def test_an_admin_revokes_a_service_accounts_token(bot_key, admin, project):
    client = bearer(api_key(admin))
    listed = client.get(f"/api/v1/projects/{project.slug}/service-accounts/").json()
    assert [(a["name"], a["role"], [t["name"] for t in a["tokens"]]) for a in listed] == [
        ("ci", "member", ["pipeline"])
    ]
    token_id = listed[0]["tokens"][0]["id"]
    url = f"/api/v1/projects/{project.slug}/service-accounts/ci/tokens/{token_id}/"
    assert client.delete(url).status_code == 204
    assert bearer(bot_key).get("/api/v1/projects/").status_code == 401
    assert AuditEvent.objects.filter(action="token.revoke", actor_name=admin.username).count() == 1


def test_a_service_account_creates_no_project_and_an_admin_one_makes_no_tokens_or_accounts(admin, project):
    client = bearer(api_key(admin))
    base = f"/api/v1/projects/{project.slug}/service-accounts/"
    assert client.post(base, {"name": "boss", "role": "admin"}, format="json").status_code == 201
    boss = bearer(client.post(f"{base}boss/tokens/", {"name": "t", "scope": "admin"}, format="json").json()["key"])
    made = boss.post("/api/v1/projects/", {"name": "Mine", "slug": "mine"}, format="json")
    assert made.status_code == 403 and "cannot create projects" in made.json()["detail"]
    assert boss.post(f"{base}boss/tokens/", {"name": "more", "scope": "admin"}, format="json").status_code == 403
    assert boss.post(base, {"name": "sibling", "role": "admin"}, format="json").status_code == 403
    assert boss.get(base).status_code == 403
    experiment = boss.post("/api/2.0/mlflow/experiments/create", {"name": "side"}, format="json")
    assert (experiment.status_code, experiment.json()["error_code"]) == (403, "PERMISSION_DENIED")
    assert boss.get("/api/2.0/mlflow/experiments/get", {"experiment_id": "0"}).status_code == 404
    assert sorted(ServiceAccount.objects.values_list("name", flat=True)) == ["boss"]
    assert not Project.objects.exclude(pk=project.pk).exists()
