"""The browsable API in a signed-in browser (docs/deploy.md#the-browsable-api; mado/browsable_api.py): ``/api/v1/``
asked for HTML with a session cookie answers the page, not a 500, for lists, details and the views that read their
input through serializers of their own; read-only (no generated forms) and with no inline style; JSON clients get
JSON as before."""

import pytest
from django.test import Client

from mado.tokens import api_token_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(creator):
    """A Django test client signed in through the login form, as a browser is (a session cookie)."""
    client = Client()
    assert client.post("/accounts/login/", {"username": creator.username, "password": "pw-123456"}).status_code == 302
    return client


def test_every_kind_of_endpoint_answers_its_page_to_a_signed_in_browser(browser, creator, project, run):
    api_token_create(user=creator, name="laptop")
    for path, shown in [
        ("/api/v1/", "/api/v1/projects/"),
        ("/api/v1/projects/", project.slug),
        (f"/api/v1/projects/{project.slug}/", project.name),
        ("/api/v1/runs/", run.name),
        (f"/api/v1/runs/{run.pk}/", run.name),
        ("/api/v1/jobs/", "results"),
        ("/api/v1/tokens/", "laptop"),
        (f"/api/v1/projects/{project.slug}/members/", creator.username),
        (f"/api/v1/runs/{run.pk}/metrics/", "keys"),
    ]:
        response = browser.get(path, HTTP_ACCEPT="text/html")
        assert response.status_code == 200, path
        assert response["Content-Type"].startswith("text/html"), path
        page = response.content.decode()
        assert shown in page, path
        assert 'id="post-object-form"' not in page and "<style>" not in page, path


def test_the_browsable_page_keeps_the_api_answers_for_outsiders_and_json_clients(browser, other_project, run):
    assert browser.get(f"/api/v1/projects/{other_project.slug}/", HTTP_ACCEPT="text/html").status_code == 404
    answer = browser.get(f"/api/v1/runs/{run.pk}/", HTTP_ACCEPT="application/json")
    assert answer.status_code == 200 and answer.json()["name"] == run.name
