"""Outages answer like a service (mado/outages.py): a database, broker or storage that cannot be reached answers
503 with ``Retry-After`` and JSON naming it on every API path (MLflow's shape on MLflow paths), the 503 page on
pages; a full volume answers 507 and the reason stays on the checkpoint. The database outage is staged with
Django's ``execute_wrapper`` (every query fails as a dropped connection does); tests/integration/
test_faults_outages.py cuts the real PostgreSQL, S3 and disk."""

import errno
from contextlib import contextmanager

import botocore.exceptions
import kombu.exceptions
import pytest
import redis.exceptions
from django.db import OperationalError, connection
from django.test import Client

from checkpoints import filesystem
from checkpoints.models import Checkpoint, CheckpointState
from mado.outages import outage_of
from tests.checkpoints.checkpoint_helpers import FillsUp, make_tar, put_tar, register

UNAVAILABLE = {"error": "unavailable", "detail": "database unavailable, retry", "field": None}


@contextmanager
def database_down():
    """Every query of this thread fails as it does when the server went away."""

    def refuse(execute, sql, params, many, context):
        raise OperationalError("server closed the connection unexpectedly")

    with connection.execute_wrapper(refuse):
        yield


class ReadsTheUser:
    """A middleware that reads ``request.user`` before the view, as many third-party ones do."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.user.is_authenticated  # noqa: B018 - loads the session and the user from the database
        return self.get_response(request)


def assert_unavailable_json(response, body=None):
    assert response.status_code == 503, response.content[:300]
    assert response["Content-Type"] == "application/json" and response["Retry-After"] == "5"
    assert response.json() == (body or UNAVAILABLE)


@pytest.mark.django_db
def test_every_api_request_during_a_database_outage_answers_503_json(api, member, run):
    client = api(member)
    requests = [
        ("get", "/api/v1/runs/", None),
        ("post", "/api/v1/runs/", {"project": "vision", "name": "x"}),
        ("get", f"/api/v1/runs/{run.pk}/", None),
        ("get", "/api/v1/jobs/", None),
        ("post", f"/api/v1/runs/{run.pk}/metrics/", {"points": [{"key": "loss", "value": 1, "step": 1}]}),
        ("get", "/api/v1/projects/", None),
    ]
    with database_down():
        for method, path, body in requests:
            assert_unavailable_json(getattr(client, method)(path, body, format="json"))
    assert client.get("/api/v1/runs/").status_code == 200  # back as soon as the database is


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/2.0/mlflow/experiments/search?max_results=5",
        "/mlflow/api/2.0/mlflow/runs/get?run_id=1",
        "/api/2.0/mlflow-artifacts/artifacts?path=1/2",
    ],
)
def test_mlflow_paths_answer_503_in_mlflows_shape(api, member, path):
    client = api(member)
    with database_down():
        response = client.get(path)
    assert_unavailable_json(
        response, {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "database unavailable, retry"}
    )


@pytest.mark.django_db
def test_pages_answer_the_503_page_in_english_and_japanese(login, member, run):
    client = login(member)
    with database_down():
        response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    page = response.content.decode()
    assert "Temporarily unavailable" in page and "接続できません" in page and "Traceback" not in page


@pytest.mark.django_db
def test_an_outage_met_by_a_middleware_before_the_view_answers_503_too(settings, member, run, api):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.mado.test_outages.ReadsTheUser"]
    page_client = Client(raise_request_exception=False)
    page_client.force_login(member)
    with database_down():
        page = page_client.get(f"/runs/{run.pk}/")
        api_answer = page_client.get("/api/v1/runs/")
    assert page.status_code == 503 and "Temporarily unavailable" in page.content.decode()
    assert_unavailable_json(api_answer)


@pytest.mark.django_db
def test_an_unexpected_error_on_an_api_path_answers_json_not_html(api, member, monkeypatch):
    from django.urls import resolve

    def broken(self, request, *args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(resolve("/api/v1/runs/").func.cls, "list", broken)  # the view that serves the URL
    client = api(member)
    client.raise_request_exception = False
    response = client.get("/api/v1/runs/")
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    assert response.json()["error"] == "internal" and "a bug" not in response.content.decode()


@pytest.mark.django_db
def test_a_full_volume_answers_507_and_the_reason_stays_on_the_checkpoint(
    api, creator, run, login, monkeypatch, tmp_path
):
    client = api(creator)
    pending = register(client, run, 10).json()
    real_open = open  # the volume fills up 100,000 bytes into the tar
    monkeypatch.setattr(filesystem, "open", lambda *args, **kw: FillsUp(real_open(*args, **kw), 100_000), raising=False)
    data = make_tar({"model.pt": b"w" * 300_000})
    response = put_tar(client, pending["id"], data)
    monkeypatch.undo()
    assert response.status_code == 507 and "Retry-After" not in response
    assert response.json()["error"] == "insufficient_storage"
    assert "no space left" in response.json()["detail"]
    stored = Checkpoint.objects.get(pk=pending["id"])
    assert stored.state == CheckpointState.PENDING and "ran out of space" in stored.error
    assert "ran out of space" in client.get(f"/api/v1/checkpoints/{stored.pk}/").json()["error"]
    pages = login(creator)
    assert stored.error in pages.get(f"/runs/{run.pk}/checkpoints/").content.decode()
    assert stored.error in pages.get(f"/checkpoints/{stored.pk}/").content.decode()
    assert [path for path in (tmp_path / "artifacts").rglob("*") if path.is_file()] == []  # no partial blob
    assert put_tar(client, pending["id"], data).status_code == 200  # space again: the same checkpoint uploads


@pytest.mark.django_db
def test_an_unknown_api_path_answers_json_404_and_an_unknown_page_the_404_page(client):
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    assert "/api/v1/no-such-thing/" in response.json()["detail"]
    mlflow = client.get("/api/2.0/mlflow-artifacts/no-such-thing")
    assert mlflow.status_code == 404 and mlflow.json()["error_code"] == "ENDPOINT_NOT_FOUND"
    page = client.get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


def _client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


@pytest.mark.parametrize(
    ("error", "component", "status"),
    [
        (OperationalError("could not connect to server"), "database", 503),
        (kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379"), "broker", 503),
        (redis.exceptions.ConnectionError("Connection refused"), "broker", 503),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3"), "storage", 503),
        (_client_error("SlowDown", 503), "storage", 503),
        (_client_error("InternalError", 500), "storage", 503),
        (OSError(errno.ENOSPC, "No space left on device"), "storage", 507),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "storage", 507),
    ],
)
def test_outages_are_named_by_component(error, component, status):
    outage = outage_of(error)
    assert (outage.component, outage.status) == (component, status)


def test_an_error_wrapping_an_outage_counts_and_others_do_not():
    try:
        try:
            raise botocore.exceptions.ConnectTimeoutError(endpoint_url="http://s3")
        except Exception as exc:
            raise RuntimeError("upload failed") from exc
    except RuntimeError as wrapped:
        assert outage_of(wrapped).component == "storage"
    assert outage_of(_client_error("NoSuchKey", 404)) is None
    assert outage_of(_client_error("AccessDenied", 403)) is None
    assert outage_of(OSError(errno.EACCES, "Permission denied")) is None
    assert outage_of(ValueError("bad input")) is None
    looped = RuntimeError("a")
    looped.__context__ = RuntimeError("b")
    looped.__context__.__context__ = looped  # a cycle must not hang the classification
    assert outage_of(looped) is None
