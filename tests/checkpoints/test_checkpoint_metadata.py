"""A checkpoint's metadata: kept as sent, shown by the API and the checkpoint page, hostile shapes refused
(docs/design/checkpoints.md#metadata)."""

import time

import pytest

from checkpoints.models import Checkpoint
from tests.checkpoints.checkpoint_helpers import complete, declaration, make_tar, put_tar, register

TAR = make_tar()
STATE = {"parts": {"model": {"sha256": "ab" * 32}, "rng.torch": {"sha256": "cd" * 32}}, "global_step": 20}


@pytest.fixture
def client(api, creator):
    return api(creator)


def test_metadata_is_kept_as_sent_and_a_replay_keeps_the_first(client, run):
    first = register(client, run, 20, key="k", metadata={"training_state": STATE, "note": "ü"})
    assert first.status_code == 201 and first.json()["metadata"] == {"training_state": STATE, "note": "ü"}
    again = register(client, run, 20, key="k", metadata={"note": "other"})
    assert again.status_code == 200 and again.json()["metadata"]["note"] == "ü"
    assert first.json()["signal_to_complete_s"] is None
    plain = register(client, run, 30, key="k30")
    assert plain.json()["metadata"] == {}


def test_a_checkpoint_saved_on_a_signal_says_how_long_it_took_to_complete(client, run, login, viewer):
    signal_at = time.time() - 2.5
    pending = register(client, run, 10, key="k", metadata={"preemption": {"signal": "SIGTERM", "signal_at": signal_at}})
    assert pending.json()["signal_to_complete_s"] is None  # not complete yet
    put_tar(client, pending.json()["id"], TAR)
    done = complete(client, pending.json()["id"], declaration(TAR)).json()
    assert done["state"] == "complete" and 2.5 <= done["signal_to_complete_s"] < 60
    page = login(viewer).get(f"/checkpoints/{done['id']}/")
    assert page.status_code == 200
    assert b"SIGTERM" in page.content and b"s after the signal" in page.content


@pytest.mark.parametrize(
    ("metadata", "field", "reason"),
    [
        ([1, 2], "metadata", "JSON object"),
        ("text", "metadata", "JSON object"),
        ({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}, "metadata", "levels deep"),
        ({"blob": "x" * (64 * 1024)}, "metadata", "at most 65536 bytes"),
        ({"preemption": "SIGTERM"}, "metadata.preemption", "object"),
        ({"preemption": {"signal": "", "signal_at": 1.0}}, "metadata.preemption.signal", "signal name"),
        ({"preemption": {"signal": "SIGTERM" * 5, "signal_at": 1.0}}, "metadata.preemption.signal", "signal name"),
        ({"preemption": {"signal": "SIGTERM", "signal_at": "now"}}, "metadata.preemption.signal_at", "epoch"),
        ({"preemption": {"signal": "SIGTERM", "signal_at": -1}}, "metadata.preemption.signal_at", "epoch"),
        ({"preemption": {"signal": "SIGTERM", "signal_at": True}}, "metadata.preemption.signal_at", "epoch"),
    ],
)
def test_bad_metadata_is_refused_naming_the_field_and_nothing_is_registered(client, run, metadata, field, reason):
    response = register(client, run, 10, key="k", metadata=metadata)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field and reason in response.json()["detail"]
    assert not Checkpoint.objects.filter(run=run).exists()


def test_a_non_finite_number_in_metadata_is_refused(client, run):
    response = client.post(
        f"/api/v1/runs/{run.pk}/checkpoints/",
        data='{"step": 10, "metadata": {"loss": NaN}}',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert response.status_code == 400 and not Checkpoint.objects.filter(run=run).exists()
