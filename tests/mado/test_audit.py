"""The audit log (docs/api.md#audit): append-only in the application and the database, the right actor for each
credential, the writes the matrix's world cannot make, who reads it, filters, CSV and retention."""

import csv
import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from checkpoints.services import checkpoint_delete
from jobs import services as job_services
from mado.audit import audit_record, audit_recorded
from mado.models import AuditEvent
from tests.factories import UserFactory, api_key
from tests.jobs.conftest import checkpoint, code_version, cpu, dataset_versions, failed_job, launch  # noqa: F401


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def actions() -> list[tuple[str, str, str]]:
    return list(AuditEvent.objects.order_by("id").values_list("action", "actor_name", "actor_kind"))


# --- append-only ------------------------------------------------------------------------------


def test_the_application_cannot_change_or_remove_a_record(db, creator):
    event = audit_record(actor=creator, action="test.thing", object_type="thing", object_id=1)
    event.action = "test.other"
    for attempt in (event.save, event.delete, AuditEvent.objects.all().delete):
        with pytest.raises(PermissionError):
            attempt()
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(pk=event.pk).update(action="x")
    assert AuditEvent.objects.get().action == "test.thing"


def test_retention_deletes_only_records_older_than_the_operators_days(db, creator, settings):
    audit_record(actor=creator, action="test.new", object_type="thing")
    insert_old_record()
    settings.MADO_AUDIT_RETENTION_DAYS = 30
    call_command("audit_prune", stdout=io.StringIO())
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["test.new"]


def insert_old_record(days: int = 40) -> None:
    """A record as inserted ``days`` ago (the application never writes a past time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO mado_auditevent (created_at, actor_kind, actor_name, via, action, object_type, object_id,"
            " object_repr, changes, request_id) VALUES (%s, 'system', '', '', 'test.old', 'thing', '', '', '{}', '')",
            [timezone.now() - timedelta(days=days)],
        )


# --- actors and writes the matrix cannot make -------------------------------------------------


def test_a_run_token_is_recorded_as_the_run_token_acting_for_the_jobs_creator(creator, code_version, cpu):  # noqa: F811
    job = job_services.job_claim(job_id=launch(creator, code_version, cpu).pk, worker_host="w")
    key = job_services.run_token_issue(job=job).key
    response = bearer(key).patch(f"/api/v1/runs/{job.run_id}/", {"status": "finished"}, format="json")
    assert response.status_code == 200
    event = AuditEvent.objects.get(action="run.end")
    assert (event.actor_kind, event.actor_name, event.via) == (
        "run_token",
        creator.username,
        f"run token of run {job.run_id}",
    )
    assert event.changes == {"status": ["pending", "finished"]}  # the Job claimed it; the code never attached


def test_an_api_token_is_named_with_its_scope_and_the_address_is_kept(admin, member, project):
    client = bearer(api_key(admin))
    response = client.patch(
        f"/api/v1/projects/{project.slug}/members/{member.username}/",
        {"role": "viewer"},
        format="json",
        REMOTE_ADDR="10.0.0.7",
        HTTP_X_REQUEST_ID="req-42",
    )
    assert response.status_code == 200 and response["X-Request-ID"] == "req-42"
    event = AuditEvent.objects.get(action="membership.change_role")
    assert (event.actor_name, event.address, event.request_id) == (admin.username, "10.0.0.7", "req-42")
    assert event.via.startswith("token “test token") and event.via.endswith("(admin)")
    assert event.changes == {"role": ["member", "viewer"]}


def test_resuming_and_deleting_a_checkpoint_are_recorded_once(creator, admin, failed_job, settings):  # noqa: F811
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    old, _newest = checkpoint(failed_job.run, 10), checkpoint(failed_job.run, 20)
    resumed = job_services.run_resume_from_checkpoint(actor=creator, checkpoint=_newest)
    checkpoint_delete(actor=admin, checkpoint=old)
    checkpoint_delete(actor=admin, checkpoint=old)  # twice: deleted once
    assert [a for a in actions() if a[0] in ("run.resume", "checkpoint.delete")] == [
        ("run.resume", creator.username, "user"),
        ("checkpoint.delete", admin.username, "user"),
    ]
    assert AuditEvent.objects.get(action="run.resume").changes["resumed_from"] == [None, failed_job.run_id]
    assert resumed.kind == "resume"


def test_an_automatic_retry_is_the_systems_doing(creator, code_version, cpu):  # noqa: F811
    job = launch(creator, code_version, cpu, max_retries=1)
    job_services.job_claim(job_id=job.pk, worker_host="w")
    job_services.job_finish(job_id=job.pk, exit_code=1)
    assert AuditEvent.objects.get(action="job.retry").actor_kind == "system"


def test_the_hook_hears_each_record_once_it_committed(db, creator, django_capture_on_commit_callbacks):
    heard = []

    def receiver(sender, event, **kwargs):
        heard.append(event.action)

    audit_recorded.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            audit_record(actor=creator, action="test.kept", object_type="thing")
        with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
            audit_record(actor=creator, action="test.rolled_back", object_type="thing")
            raise RuntimeError
    finally:
        audit_recorded.disconnect(receiver)
    assert heard == ["test.kept"]


# --- reading: page, CSV, API ------------------------------------------------------------------


@pytest.fixture
def some_records(admin, member, project, other_project, outsider):
    client = bearer(api_key(admin))
    client.patch(f"/api/v1/projects/{project.slug}/members/{member.username}/", {"role": "viewer"}, format="json")
    client.patch(f"/api/v1/projects/{project.slug}/parity/", {"tolerance": 0.01}, format="json")
    bearer(api_key(outsider)).post(
        f"/api/v1/projects/{other_project.slug}/members/", {"username": admin.username, "role": "viewer"}, format="json"
    )
    return project


def test_a_project_admin_reads_filters_and_downloads_the_projects_records(client, admin, some_records):
    client.force_login(admin)
    page = client.get(f"/projects/{some_records.slug}/audit/")
    assert page.status_code == 200
    assert b"membership.change_role" in page.content and b"project.set_parity_tolerance" in page.content
    assert b"membership.add" not in page.content, "another Project's records stay hidden"
    filtered = client.get(f"/projects/{some_records.slug}/audit/", {"action": "membership."})
    assert b"project.set_parity_tolerance" not in filtered.content
    response = client.get(f"/projects/{some_records.slug}/audit.csv", {"action": "membership."})
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r["action"], r["actor_name"]) for r in rows] == [("membership.change_role", admin.username)]


def test_the_api_gives_admins_their_projects_records_and_superusers_all(admin, member, some_records):
    mine = bearer(api_key(admin)).get("/api/v1/audit/").json()["results"]
    assert {r["action"] for r in mine} >= {"membership.change_role", "project.set_parity_tolerance"}
    assert "membership.add" not in {r["action"] for r in mine}
    assert bearer(api_key(member)).get("/api/v1/audit/").json()["results"] == []
    root = UserFactory(username="root", is_superuser=True, is_staff=True)
    everything = bearer(api_key(root)).get("/api/v1/audit/", {"action": "membership."}).json()["results"]
    assert {r["action"] for r in everything} == {"membership.change_role", "membership.add"}
    exported = bearer(api_key(admin)).get("/api/v1/audit/", {"export": "csv", "action": "project."})
    assert exported["Content-Type"].startswith("text/csv")
    assert b"project.set_parity_tolerance" in b"".join(exported.streaming_content)
