"""API tokens (docs/api.md#tokens): never stored in clear, refused once revoked or expired on every surface,
limited to their scope, their last use recorded, managed from the account page and the API."""

import base64
import io
from datetime import timedelta

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import services as job_services
from jobs.models import Queue, RunToken
from mado import tokens
from mado.models import ApiToken
from runs.models import Membership
from tests.factories import CodeVersionFactory, api_key
from tests.jobs.conftest import launch

SURFACES = {
    "native API": "/api/v1/projects/",
    "MLflow tracking API": "/api/2.0/mlflow/experiments/search?max_results=5",
    "MLflow tracking API under mlflow/": "/mlflow/api/2.0/mlflow/experiments/search?max_results=5",
    "MLflow artifact API": "/api/2.0/mlflow-artifacts/artifacts",
}


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def running_job(creator, project):
    code_version = CodeVersionFactory(code__project=project, code__created_by=creator, version=1)
    job = launch(creator, code_version, Queue.objects.get_or_create(name="cpu")[0])
    return job_services.job_claim(job_id=job.pk, worker_host="gpu-1")


def every_text_in_the_database() -> str:
    """Every row of every table of every installed model (and Django's own tables), as text."""
    texts = []
    tables = set(connection.introspection.table_names(include_views=True))
    with connection.cursor() as cursor:
        for table in sorted(tables):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            texts += [repr(row) for row in cursor.fetchall()]
    return "\n".join(texts)


def test_no_issued_token_of_any_kind_is_stored_in_clear(client, creator, project, running_job):
    issued = [api_key(creator, scope="read"), job_services.run_token_issue(job=running_job).key]
    client.force_login(creator)
    page = client.post("/accounts/tokens/", {"name": "laptop", "scope": "write", "expires_in_days": 7})
    issued.append(page.context["key"])
    api = APIClient()
    api.force_authenticate(creator)
    issued.append(api.post("/api/v1/tokens/", {"name": "ci", "scope": "admin"}, format="json").json()["key"])
    out = io.StringIO()
    call_command("mado_token", creator.username, stdout=out)
    issued.append(out.getvalue().strip())
    assert [bearer(key).get(f"/api/v1/runs/{running_job.run_id}/").status_code for key in issued] == [200] * 5
    tables = set(connection.introspection.table_names(include_views=True))
    assert {model._meta.db_table for model in apps.get_models()} <= tables, "the scan reads every model's table"
    dump = every_text_in_the_database()
    assert "laptop" in dump and "mado_" in dump, "the scan sees the token rows"
    # neither a whole key nor the part after the stored prefix appears anywhere
    assert [key for key in issued if key in dump or key[tokens.PREFIX_LENGTH :] in dump] == []


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("how", ["revoked", "expired"])
def test_a_revoked_or_expired_token_gets_401_on_every_surface(creator, project, surface, how):
    key = api_key(creator)
    assert bearer(key).get(SURFACES[surface]).status_code != 401
    token = ApiToken.objects.get(user=creator)
    if how == "revoked":
        tokens.api_token_revoke(user=creator, token_id=token.pk)
    else:
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(key).get(SURFACES[surface]).status_code == 401
    basic = APIClient()
    basic.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{creator.username}:{key}".encode()).decode())
    assert basic.get(SURFACES[surface]).status_code == 401


@pytest.mark.parametrize("surface", SURFACES)
def test_a_ended_jobs_run_token_gets_401_on_every_surface(running_job, surface):
    key = job_services.run_token_issue(job=running_job).key
    job_services.job_finish(job_id=running_job.pk, exit_code=0)
    assert bearer(key).get(SURFACES[surface]).status_code == 401


def test_the_last_use_time_and_address_are_recorded(creator, project):
    key = api_key(creator)
    client = bearer(key)
    assert client.get("/api/v1/projects/", REMOTE_ADDR="10.1.2.3").status_code == 200
    token = ApiToken.objects.get(user=creator)
    assert token.last_used_ip == "10.1.2.3" and timezone.now() - token.last_used_at < timedelta(seconds=5)


def test_an_admins_write_token_cannot_do_what_only_admins_do(admin, member, project):
    client = bearer(api_key(admin, scope="write"))
    response = client.delete(f"/api/v1/projects/{project.slug}/members/{member.username}/")
    assert response.status_code == 403
    assert Membership.objects.filter(user=member, project=project).exists()
    assert (
        bearer(api_key(admin, scope="admin"))
        .delete(f"/api/v1/projects/{project.slug}/members/{member.username}/")
        .status_code
        == 204
    )


def test_a_read_token_reads_and_is_refused_every_write_with_the_reason(creator, project):
    client = bearer(api_key(creator, scope="read"))
    assert client.get("/api/v1/runs/").status_code == 200
    response = client.post("/api/v1/runs/", {"project": project.slug, "name": "x"}, format="json")
    assert response.status_code == 403 and "write scope" in response.json()["detail"]
    mlflow = client.post("/api/2.0/mlflow/runs/create", {"experiment_id": str(project.pk)}, format="json")
    assert mlflow.status_code == 403 and mlflow.json()["error_code"] == "PERMISSION_DENIED"
    assert (
        client.post("/api/2.0/mlflow/runs/search", {"experiment_ids": [str(project.pk)]}, format="json").status_code
        == 200
    )


def test_a_token_lasts_the_operators_default_and_no_longer_than_the_maximum(creator, settings):
    settings.MADO_TOKEN_DEFAULT_DAYS, settings.MADO_TOKEN_MAX_DAYS = 30, 60
    client = APIClient()
    client.force_authenticate(creator)
    made = client.post("/api/v1/tokens/", {"name": "default"}, format="json").json()
    assert made["scope"] == "write"
    lifetime = timezone.datetime.fromisoformat(made["expires_at"]) - timezone.now()
    assert timedelta(days=29, hours=23) < lifetime <= timedelta(days=30)
    refused = client.post("/api/v1/tokens/", {"name": "long", "expires_in_days": 61}, format="json")
    assert (refused.status_code, refused.json()["field"]) == (400, "expires_in_days")
    assert client.post("/api/v1/tokens/", {"name": "default"}, format="json").status_code == 409


def test_tokens_are_listed_without_keys_and_revoked_through_the_api(creator):
    client = APIClient()
    client.force_authenticate(creator)
    made = client.post("/api/v1/tokens/", {"name": "ci", "scope": "read"}, format="json").json()
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci"] and "key" not in listed[0]
    assert client.delete(f"/api/v1/tokens/{made['id']}/").status_code == 204
    assert client.delete(f"/api/v1/tokens/{made['id']}/").status_code == 204  # twice: still revoked
    assert bearer(made["key"]).get("/api/v1/projects/").status_code == 401


def test_the_account_page_shows_a_new_key_once_and_revokes(client, creator):
    client.force_login(creator)
    created = client.post("/accounts/tokens/", {"name": "laptop", "scope": "read", "expires_in_days": 7})
    key = created.context["key"]
    assert created.status_code == 200 and key.encode() in created.content
    again = client.get("/accounts/tokens/")
    assert key.encode() not in again.content and b"laptop" in again.content
    token = ApiToken.objects.get(name="laptop")
    assert client.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 302
    assert bearer(key).get("/api/v1/projects/").status_code == 401


def test_a_retried_worker_gets_the_same_run_token_and_a_carried_over_one_is_replaced(running_job):
    first = job_services.run_token_issue(job=running_job)
    assert job_services.run_token_issue(job=running_job).key == first.key
    RunToken.objects.filter(pk=first.pk).update(salt="")  # as the migration leaves a plain token it hashed
    replaced = job_services.run_token_issue(job=running_job)
    assert replaced.key != first.key and bearer(first.key).get("/api/v1/projects/").status_code == 401
    assert bearer(replaced.key).get(f"/api/v1/runs/{running_job.run_id}/").status_code == 200
