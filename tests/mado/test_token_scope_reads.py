"""A token's scope bounds its reads as well as its writes (docs/api.md#tokens): a ``read`` token makes nothing,
not even the MLflow default experiment a first read would create, and an admin's narrower token reads no admin
records (the audit log)."""

import pytest
from rest_framework.test import APIClient

from runs.models import Project
from tests.factories import UserFactory, api_key

pytestmark = pytest.mark.django_db


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_a_read_token_creates_no_default_experiment_and_a_write_token_does(admin):
    read = bearer(api_key(admin, scope="read")).get("/api/2.0/mlflow/experiments/get", {"experiment_id": "0"})
    assert (read.status_code, read.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    assert not Project.objects.filter(default_for=admin).exists()
    write = bearer(api_key(admin, scope="write")).get("/api/2.0/mlflow/experiments/get", {"experiment_id": "0"})
    assert write.status_code == 200 and Project.objects.filter(default_for=admin).count() == 1


def test_a_read_token_creates_no_project(admin):
    made = bearer(api_key(admin, scope="read")).post("/api/v1/projects/", {"name": "New"}, format="json")
    assert made.status_code == 403 and not Project.objects.filter(slug="new").exists()


def test_the_audit_log_honours_the_tokens_scope(admin, project):
    UserFactory(username="newbie")
    added = bearer(api_key(admin)).post(
        f"/api/v1/projects/{project.slug}/members/", {"username": "newbie", "role": "viewer"}, format="json"
    )
    assert added.status_code == 201
    assert bearer(api_key(admin, scope="admin")).get("/api/v1/audit/").json()["count"] >= 1
    for scope in ("read", "write"):
        assert bearer(api_key(admin, scope=scope)).get("/api/v1/audit/").json()["count"] == 0
