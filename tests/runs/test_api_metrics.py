"""API: runs/{id}/metrics/ batch ingestion and paginated history (docs/api.md; docs/design/resume.md#steps-continue)."""

import json
import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.metrics import metrics_ingest
from runs.models import MetricPoint

READ = [("admin", 200), ("member", 200), ("creator", 200), ("viewer", 200), ("outsider", 404), ("anonymous", 401)]
# Writing to a Run: its creator or a Project admin; another member reads only (docs/design/runs.md#write-rule).
WRITE = [("admin", 201), ("member", 403), ("creator", 201), ("viewer", 403), ("outsider", 404), ("anonymous", 401)]


def post_points(client, run, points):
    return client.post(
        f"/api/v1/runs/{run.pk}/metrics/", json.dumps({"points": points}), content_type="application/json"
    )


def log(run, creator, count, key="loss", **extra):
    metrics_ingest(
        actor=creator, run=run, points=[{"key": key, "value": i / 2, "step": i, **extra} for i in range(count)]
    )


@pytest.mark.parametrize("role, status", WRITE)
def test_metric_post_permission_matrix(client_as, run, role, status):
    response = post_points(client_as(role), run, [{"key": "loss", "value": 0.5, "step": 1}])
    assert response.status_code == status
    assert MetricPoint.objects.filter(run=run).count() == (1 if status == 201 else 0)
    if status == 201:
        assert response.json() == {"stored": 1, "compared": 0, "dropped": 0, "dropped_keys": []}


@pytest.mark.parametrize("role, status", READ)
def test_metric_keys_permission_matrix(client_as, run, creator, role, status):
    log(run, creator, 2, key="loss")
    log(run, creator, 1, key="acc")
    response = client_as(role).get(f"/api/v1/runs/{run.pk}/metrics/")
    assert response.status_code == status
    if status == 200:
        assert response.json() == {"keys": ["acc", "loss"]}


@pytest.mark.parametrize("role, status", READ)
def test_metric_history_permission_matrix(client_as, run, creator, role, status):
    log(run, creator, 3, timestamp=1_700_000_000.25)
    response = client_as(role).get(f"/api/v1/runs/{run.pk}/metrics/?key=loss")
    assert response.status_code == status
    if status == 200:
        assert response.json()["results"][1] == {"step": 1, "value": 0.5, "timestamp": 1_700_000_000.25}


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"value": 1.0, "step": 0}, "points[1].key"),
        ({"key": "loss", "value": "high", "step": 0}, "points[1].value"),
        ({"key": "loss", "value": True, "step": 0}, "points[1].value"),
        ({"key": "loss", "value": 1.0, "step": -1}, "points[1].step"),
        ({"key": "loss", "value": 1.0, "step": 1.5}, "points[1].step"),
        ({"key": "loss", "value": 1.0, "step": 2, "timestamp": "yesterday"}, "points[1].timestamp"),
        ({"key": "loss", "value": 1.0, "step": 2, "timestamp": 10**400}, "points[1].timestamp"),
        ({"key": "loss", "value": 10**400, "step": 2}, "points[1].value"),
        ({"key": "loss", "value": 1.0, "step": 2**63}, "points[1].step"),
        ({"key": "lo\u0000ss", "value": 1.0, "step": 2}, "points[1].key"),
        ({"key": "k" * 251, "value": 1.0, "step": 2}, "points[1].key"),
    ],
)
def test_one_bad_point_refuses_the_batch_and_names_its_field(client_as, run, bad, field):
    response = post_points(client_as("creator"), run, [{"key": "loss", "value": 0.1, "step": 0}, bad])
    assert response.status_code == 400
    assert response.json()["error"] == "invalid" and response.json()["field"] == field
    assert not MetricPoint.objects.exists()


def test_a_batch_over_ten_thousand_points_is_refused(client_as, run):
    response = post_points(client_as("creator"), run, [{"key": "k", "value": 1, "step": i} for i in range(10_001)])
    assert response.status_code == 400 and response.json()["field"] == "points"
    assert not MetricPoint.objects.exists()


def test_a_batch_of_ten_thousand_points_is_stored_whole(client_as, run):
    response = post_points(client_as("creator"), run, [{"key": "k", "value": i, "step": i} for i in range(10_000)])
    assert response.status_code == 201
    assert response.json() == {"stored": 10_000, "compared": 0, "dropped": 0, "dropped_keys": []}
    assert MetricPoint.objects.filter(run=run).count() == 10_000


@pytest.mark.parametrize("body", ["not json", "[1, 2]", '{"point": []}', '{"points": {}}', '{"points": []}'])
def test_a_malformed_body_is_refused_with_a_json_error(client_as, run, body):
    response = client_as("creator").post(f"/api/v1/runs/{run.pk}/metrics/", body, content_type="application/json")
    assert response.status_code == 400
    assert set(response.json()) >= {"error", "detail", "field"} and response.json()["field"] in {"body", "points"}


def test_non_finite_values_are_stored_and_returned_as_strings(client_as, run):
    client = client_as("creator")
    raw = (
        '{"points": [{"key": "loss", "value": NaN, "step": 0}, {"key": "loss", "value": "Infinity", "step": 1},'
        ' {"key": "loss", "value": "-Infinity", "step": 2}, {"key": "loss", "value": 1e308, "step": 3}]}'
    )
    assert client.post(f"/api/v1/runs/{run.pk}/metrics/", raw, content_type="application/json").status_code == 201
    response = client.get(f"/api/v1/runs/{run.pk}/metrics/?key=loss")
    assert [p["value"] for p in response.json()["results"]] == ["NaN", "Infinity", "-Infinity", 1e308]
    assert "NaN" in response.content.decode() and "Infinity" in response.content.decode()
    json.loads(response.content, parse_constant=lambda name: pytest.fail(f"bare {name} in JSON"))


def test_history_is_ordered_by_step_and_paginated(client_as, run, creator):
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": s, "step": s} for s in (4, 0, 3, 1, 2)])
    client = client_as("viewer")
    first = client.get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&page_size=2").json()
    assert first["count"] == 5 and [p["step"] for p in first["results"]] == [0, 1] and first["previous"] is None
    second = client.get(first["next"]).json()
    assert [p["step"] for p in second["results"]] == [2, 3]
    third = client.get(second["next"]).json()
    assert [p["step"] for p in third["results"]] == [4] and third["next"] is None
    assert client.get(third["previous"]).json() == second
    assert "page=" not in client.get(second["previous"]).wsgi_request.get_full_path()


def test_history_of_an_unknown_key_is_an_empty_first_page(client_as, run):
    response = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=nothing")
    assert response.json() == {"count": 0, "next": None, "previous": None, "results": []}


def test_a_page_past_the_end_answers_404(client_as, run, creator):
    log(run, creator, 3)
    response = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&page=2&page_size=3")
    assert response.status_code == 404 and response.json()["field"] == "page"


@pytest.mark.parametrize("query, field", [("page=0", "page"), ("page=x", "page"), ("page_size=-5", "page_size")])
def test_bad_paging_parameters_name_the_field(client_as, run, query, field):
    response = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&{query}")
    assert response.status_code == 400 and response.json()["field"] == field


def test_page_size_is_capped_at_the_history_maximum(client_as, run, creator, settings):
    settings.MADO_METRIC_HISTORY_PAGE_MAX = 4
    log(run, creator, 10)
    body = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&page_size=100000").json()
    assert len(body["results"]) == 4 and body["next"] is not None


def test_a_hundred_thousand_point_page_comes_back_whole(client_as, run, creator, settings):
    settings.MADO_METRIC_BATCH_MAX = 100_000
    metrics_ingest(
        actor=creator,
        run=run,
        points=[
            {"key": "loss", "value": math.nan if i % 1000 == 0 else i * 0.5, "step": i, "timestamp": 1_700_000_000}
            for i in range(100_000)
        ],
    )
    body = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&page_size=100000").json()
    assert body["count"] == 100_000 and len(body["results"]) == 100_000 and body["next"] is None
    assert body["results"][0]["value"] == "NaN" and body["results"][99_999] == {
        "step": 99_999,
        "value": 49_999.5,
        "timestamp": 1_700_000_000.0,
    }


def test_a_batch_repeated_with_its_idempotency_key_is_stored_once(client_as, run):
    client = client_as("creator")
    points = [{"key": "loss", "value": 0.5, "step": s} for s in range(3)]
    body = json.dumps({"points": points})
    url = f"/api/v1/runs/{run.pk}/metrics/"
    first = client.post(url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="batch-1")
    again = client.post(url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="batch-1")
    other = client.post(url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="batch-2")
    assert (first.status_code, first.json()) == (201, {"stored": 3, "compared": 0, "dropped": 0, "dropped_keys": []})
    assert (again.status_code, again.json()) == (200, {"stored": 0, "compared": 0, "dropped": 0, "dropped_keys": []})
    assert other.status_code == 201
    assert MetricPoint.objects.filter(run=run).count() == 6


def test_a_refused_batch_does_not_burn_its_idempotency_key(client_as, run):
    client = client_as("creator")
    url = f"/api/v1/runs/{run.pk}/metrics/"
    bad = client.post(
        url,
        json.dumps({"points": [{"key": "loss", "value": "x", "step": 0}]}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    good = client.post(
        url,
        json.dumps({"points": [{"key": "loss", "value": 1, "step": 0}]}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert bad.status_code == 400 and good.status_code == 201


def test_a_metrics_post_reads_its_run_and_the_writers_role_in_one_query(client_as, run):
    # The hot path of 20 writers (docs/design/resume.md#steps-continue): no DISTINCT over the Run's columns (a user has
    # one membership per Project), the role joined to the Run's lookup instead of a query of its own, and the write
    # itself sent as one group of statements (the Run's row, the claim, the summary, the rollups; the chunks go through
    # their own cursor).
    client = client_as("creator")
    body = json.dumps({"keys": ["loss", "acc"], "steps": [1, 1], "values": [0.5, 0.25]})
    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            f"/api/v1/runs/{run.pk}/metrics/",
            body,
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="batch-1",
            HTTP_MADO_FENCING_TOKEN=str(run.lease_token),
        )
    assert response.status_code == 201 and response.json()["stored"] == 2
    statements = [q["sql"] for q in queries.captured_queries]
    assert not [sql for sql in statements if "DISTINCT" in sql]
    assert not [sql for sql in statements if 'FROM "runs_membership"' in sql]
    assert len([sql for sql in statements if 'FROM "runs_run"' in sql and 'INNER JOIN "runs_membership"' in sql]) == 1
    assert len([sql for sql in statements if "FROM runs_run" in sql]) == 1  # lease and crashed: one read
