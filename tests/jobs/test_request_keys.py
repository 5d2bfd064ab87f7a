"""A double-clicked Launch or Continue, or an API retry with the same Idempotency-Key, creates one Job
(docs/design/house.md#idempotent)."""

import re

import pytest

from jobs.models import Job

URL = "/api/v1/jobs/"


@pytest.fixture
def body(code_version, cpu):
    return {"code_version_id": code_version.pk, "parameters": {"lr": 0.1}}


def test_an_api_launch_retried_with_its_key_returns_the_first_job(
    client_as, body, celery_calls, django_capture_on_commit_callbacks
):
    client = client_as("member")
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
        again = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
        other = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert first.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert other.json()["id"] != first.json()["id"]
    assert Job.objects.count() == 2 and len(celery_calls.sent) == 2


def test_the_same_key_from_another_user_is_another_job(client_as, body):
    first = client_as("member").post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="k")
    second = client_as("admin").post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert first.json()["id"] != second.json()["id"]


def test_a_double_clicked_launch_form_queues_one_job(
    client, member, project, code_version, cpu, celery_calls, django_capture_on_commit_callbacks
):
    client.force_login(member)
    page = client.get(f"/projects/{project.slug}/jobs/new/").content.decode()
    token = re.search(r'name="request_key" value="([0-9a-f]{32})"', page).group(1)
    form = {
        "code_version": code_version.pk,
        "parameters": "{}",
        "queue": "cpu",
        "kind": "training",
        "max_retries": 0,
        "name": "twice",
        "request_key": token,
    }
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/projects/{project.slug}/jobs/new/", form).status_code == 302
        assert client.post(f"/projects/{project.slug}/jobs/new/", form).status_code == 302
    assert Job.objects.filter(run__name="twice").count() == 1 and len(celery_calls.sent) == 1
