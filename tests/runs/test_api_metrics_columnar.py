"""API: the columnar metrics batch ``{"keys", "steps", "values", "timestamps"}`` (what the SDK sends) and the
``max_points`` history read downsampled in SQL (docs/api.md; docs/design/resume.md#steps-continue)."""

import json

import pytest

from runs.metrics import metrics_ingest
from runs.models import MetricPoint, MetricSummary


def post(client, run, body):
    raw = body if isinstance(body, str) else json.dumps(body)
    return client.post(f"/api/v1/runs/{run.pk}/metrics/", raw, content_type="application/json")


def test_a_columnar_batch_is_stored_like_the_same_points_as_rows(client_as, run):
    client = client_as("creator")
    body = {
        "keys": ["loss", "acc", "loss"],
        "steps": [0, 0, 1],
        "values": [0.5, "NaN", "-Infinity"],
        "timestamps": [1700000000.25, 1700000000.5, 1700000001],
    }
    response = post(client, run, body)
    assert response.status_code == 201
    assert response.json() == {"stored": 3, "compared": 0, "dropped": 0, "dropped_keys": []}
    history = client.get(f"/api/v1/runs/{run.pk}/metrics/?key=loss").json()
    assert history["count"] == 2
    assert history["results"] == [
        {"step": 0, "value": 0.5, "timestamp": 1700000000.25},
        {"step": 1, "value": "-Infinity", "timestamp": 1700000001.0},
    ]
    assert client.get(f"/api/v1/runs/{run.pk}/metrics/").json() == {"keys": ["acc", "loss"]}


def test_timestamps_are_optional_in_the_columnar_form(client_as, run):
    assert post(client_as("creator"), run, {"keys": ["a"], "steps": [3], "values": [1]}).status_code == 201
    assert MetricPoint.objects.get(run=run).timestamp > 1_700_000_000_000


BAD = [
    ({"keys": ["a"], "steps": [0], "values": [1], "points": []}, "points"),
    ({"keys": "a", "steps": [0], "values": [1]}, "keys"),
    ({"keys": [], "steps": [], "values": []}, "keys"),
    ({"keys": ["a", "b"], "steps": [0], "values": [1, 2]}, "steps"),
    ({"keys": ["a"], "steps": [0], "values": {"0": 1}}, "values"),
    ({"keys": ["a"], "steps": [0], "values": [1], "timestamps": [1, 2]}, "timestamps"),
    ({"keys": ["a"], "steps": [0], "values": [1], "extra": 1}, "extra"),
    ({"keys": ["a", ""], "steps": [0, 1], "values": [1, 2]}, "keys[1]"),
    ({"keys": ["a", "x" * 251], "steps": [0, 1], "values": [1, 2]}, "keys[1]"),
    ({"keys": ["a", "b\x00"], "steps": [0, 1], "values": [1, 2]}, "keys[1]"),
    ({"keys": ["a", ["b"]], "steps": [0, 1], "values": [1, 2]}, "keys[1]"),
    ({"keys": ["a", "a"], "steps": [0, -1], "values": [1, 2]}, "steps[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1.5], "values": [1, 2]}, "steps[1]"),
    ({"keys": ["a", "a"], "steps": [0, True], "values": [1, 2]}, "steps[1]"),
    ({"keys": ["a", "a"], "steps": [0, "1"], "values": [1, 2]}, "steps[1]"),
    ({"keys": ["a", "a"], "steps": [0, 2**63], "values": [1, 2]}, "steps[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1], "values": [1, True]}, "values[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1], "values": [1, "nope"]}, "values[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1], "values": [1, None]}, "values[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1], "values": [1, 10**400]}, "values[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1], "values": [1, 2], "timestamps": [1, -1]}, "timestamps[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1], "values": [1, 2], "timestamps": [1, "now"]}, "timestamps[1]"),
    ({"keys": ["a", "a"], "steps": [0, 1], "values": [1, 2], "timestamps": [1, 1e300]}, "timestamps[1]"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_a_bad_columnar_batch_is_refused_naming_the_field_and_nothing_is_stored(client_as, run, creator, body, field):
    metrics_ingest(actor=creator, run=run, points=[{"key": "kept", "value": 1.0, "step": 0}])
    response = post(client_as("creator"), run, body)
    assert response.status_code == 400, response.json()
    assert response.json()["field"] == field
    assert list(MetricPoint.objects.filter(run=run).values_list("key", flat=True)) == ["kept"]
    assert list(MetricSummary.objects.filter(run=run).values_list("key", "count")) == [("kept", 1)]


@pytest.mark.parametrize(
    "raw",
    [
        '{"keys": ["a"], "steps": [1e999], "values": [1]}',
        '{"keys": ["a"], "steps": [123456789012345678901234567890], "values": [1]}',
        '{"keys": ["a"], "steps": [0], "values": [NaN], "timestamps": [NaN]}',
    ],
)
def test_hostile_numbers_in_a_columnar_batch_name_their_column(client_as, run, raw):
    response = post(client_as("creator"), run, raw)
    assert response.status_code == 400 and response.json()["field"] in {"steps[0]", "timestamps[0]"}
    assert not MetricPoint.objects.filter(run=run).exists()


def test_a_viewer_cannot_post_a_columnar_batch(client_as, run):
    assert post(client_as("viewer"), run, {"keys": ["a"], "steps": [0], "values": [1]}).status_code == 403
    assert not MetricSummary.objects.filter(run=run).exists()


def test_max_points_keeps_each_buckets_extremes_and_counts_what_it_leaves_out(client_as, run, creator):
    values = [1.0] * 1000
    values[500] = 50.0  # a spike a plain stride would miss
    values[700] = -3.0
    points = [{"key": "loss", "value": v, "step": s, "timestamp": 1} for s, v in enumerate(values)]
    points.append({"key": "loss", "value": "NaN", "step": 1000})
    metrics_ingest(actor=creator, run=run, points=points)
    body = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&max_points=20").json()
    assert body["count"] == 1001 and body["non_finite"] == 1 and body["next"] is None
    steps, values = body["results"]["steps"], body["results"]["values"]
    assert 2 <= len(steps) == len(values) == len(body["results"]["timestamps"]) <= 20
    assert {(500, 50.0), (700, -3.0)} <= set(zip(steps, values))
    assert steps == sorted(steps)


@pytest.mark.parametrize("max_points", ["1", "0", "x", "100001"])
def test_max_points_out_of_range_is_refused(client_as, run, max_points):
    response = client_as("viewer").get(f"/api/v1/runs/{run.pk}/metrics/?key=loss&max_points={max_points}")
    assert response.status_code == 400 and response.json()["field"] == "max_points"
