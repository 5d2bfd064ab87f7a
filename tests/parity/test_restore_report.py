"""The restore report a resumed Run's SDK sends after loading its checkpoint (docs/design/resume.md#restore-report):
hostile bodies answer 400 naming the field and store nothing; one report per Run, a later one replacing it; only the
Run's writers, fenced; shown as ``restore_report`` on the Run and Job resources."""

import json

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from mado.errors import ValidationFailed
from parity.models import RestoreReport
from parity.services import clean_restore_report
from runs.resume import run_start
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

GOOD = {
    "parts": {"model": "restored", "optimizer": "restored", "scheduler": "not_restored", "rng.python": "not_restored"},
    "details": {"scheduler": "scheduler rebuilt: state differs from the checkpoint's", "rng.python": "re-seeded"},
}


def url(run) -> str:
    return f"/api/v1/runs/{run.pk}/restore-report/"


@pytest.mark.parametrize(
    "body, field",
    [
        ([], "body"),
        ("parts", "body"),
        (None, "body"),
        ({"parts": {"model": "restored"}, "extra": 1}, "extra"),
        ({"parts": {"model": "restored"}, "x" * 5000: 1}, "body"),
        ({}, "parts"),
        ({"parts": {}}, "parts"),
        ({"parts": ["model"]}, "parts"),
        ({"parts": {"weights": "restored"}}, "parts"),
        ({"parts": {"model\x00": "restored"}}, "parts"),
        ({"parts": {"rng.cuda.x": "restored"}}, "parts"),
        ({"parts": {"generator.": "restored"}}, "parts"),
        ({"parts": {"generator." + "g" * 101: "restored"}}, "parts"),
        ({"parts": {f"generator.g{i}": "restored" for i in range(129)}}, "parts"),
        ({"parts": {"model": "yes"}}, "parts.model"),
        ({"parts": {"model": True}}, "parts.model"),
        ({"parts": {"model": None}}, "parts.model"),
        ({"parts": {"model": ["restored"]}}, "parts.model"),
        ({"parts": {"model": "restored"}, "checkpoint_id": "7"}, "checkpoint_id"),
        ({"parts": {"model": "restored"}, "checkpoint_id": True}, "checkpoint_id"),
        ({"parts": {"model": "restored"}, "checkpoint_id": 0}, "checkpoint_id"),
        ({"parts": {"model": "restored"}, "checkpoint_id": 2**64}, "checkpoint_id"),
        ({"parts": {"model": "restored"}, "checkpoint_id": 1.5}, "checkpoint_id"),
        ({"parts": {"model": "restored"}, "details": "rebuilt"}, "details"),
        ({"parts": {"model": "restored"}, "details": {"optimizer": "not listed"}}, "details.optimizer"),
        ({"parts": {"model": "restored"}, "details": {"<script>": "x"}}, "details"),
        ({"parts": {"model": "restored"}, "details": {"model": 3}}, "details.model"),
        ({"parts": {"model": "restored"}, "details": {"model": "two\nlines"}}, "details.model"),
        ({"parts": {"model": "restored"}, "details": {"model": "x" * 501}}, "details.model"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(body, field):
    with pytest.raises(ValidationFailed) as refused:
        clean_restore_report(body)
    assert refused.value.field == field
    assert len(refused.value.detail) < 300  # a hostile key is never echoed whole


def test_every_part_name_of_the_contract_is_accepted():
    names = [
        "model",
        "optimizer",
        "optimizer.1",
        "scheduler",
        "scaler",
        "rng.python",
        "rng.numpy",
        "rng.torch",
        "rng.cuda.0",
        "rng.cuda.7",
        "generator.batches",
        "data_position",
        "global_step",
    ]
    checkpoint_id, parts, details = clean_restore_report(
        {"parts": dict.fromkeys(names, "unknown"), "checkpoint_id": None}
    )
    assert (checkpoint_id, sorted(parts), details) == (None, sorted(names), {})


def test_the_runs_writer_stores_one_report_and_a_later_one_replaces_it(api, creator, child, source_checkpoint):
    client = api(creator)
    first = client.post(url(child), {**GOOD, "checkpoint_id": source_checkpoint.pk}, format="json")
    assert first.status_code == 201, first.content
    assert first.json()["not_restored"] == ["rng.python", "scheduler"]
    again = client.post(
        url(child), {"checkpoint_id": source_checkpoint.pk, "parts": {"model": "restored"}}, format="json"
    )
    assert again.status_code == 200
    report = RestoreReport.objects.get(run=child)
    assert (report.parts, report.details, report.reports, report.checkpoint_id) == (
        {"model": "restored"},
        {},
        2,
        source_checkpoint.pk,
    )


def test_a_bad_report_over_http_names_the_field_and_keeps_the_stored_one(api, creator, child):
    client = api(creator)
    assert client.post(url(child), GOOD, format="json").status_code == 201
    for raw, field in [
        (b"{not json", None),
        (json.dumps({"parts": {"model": "maybe"}}).encode(), "parts.model"),
        (json.dumps([1, 2]).encode(), "body"),
    ]:
        answer = client.post(url(child), raw, content_type="application/json")
        assert answer.status_code == 400, answer.content
        if field:
            assert answer.json()["field"] == field
    assert RestoreReport.objects.get(run=child).parts == GOOD["parts"]


def test_a_checkpoint_of_another_project_is_refused(api, creator, child, other_project):
    elsewhere = Checkpoint.objects.create(
        run=RunFactory(project=other_project), step=5, state=CheckpointState.COMPLETE, file_count=1
    )
    answer = api(creator).post(url(child), {**GOOD, "checkpoint_id": elsewhere.pk}, format="json")
    assert (answer.status_code, answer.json()["field"]) == (400, "checkpoint_id")
    assert not RestoreReport.objects.filter(run=child).exists()


def test_only_the_runs_writers_report_and_an_outsider_sees_nothing(api, member, viewer, outsider, admin, child):
    assert api(member).post(url(child), GOOD, format="json").status_code == 403
    assert api(viewer).post(url(child), GOOD, format="json").status_code == 403
    assert api(outsider).post(url(child), GOOD, format="json").status_code == 404
    assert api(admin).post(url(child), GOOD, format="json").status_code == 201


def test_a_stale_fencing_token_is_refused_and_the_current_one_is_taken(api, creator, project):
    run = run_start(actor=creator, project=project, external_id="same-run", resume="allow").run
    stale = run.lease_token
    run = run_start(actor=creator, project=project, external_id="same-run", resume="allow").run
    client = api(creator)
    refused = client.post(url(run), GOOD, format="json", HTTP_MADO_FENCING_TOKEN=str(stale))
    assert (refused.status_code, refused.json()["error"]) == (409, "lease_lost")
    taken = client.post(url(run), GOOD, format="json", HTTP_MADO_FENCING_TOKEN=str(run.lease_token))
    assert taken.status_code == 201


def test_the_run_and_job_resources_show_what_was_not_restored(api, creator, child, source_checkpoint):
    client = api(creator)
    assert client.get(f"/api/v1/runs/{child.pk}/").json()["restore_report"] is None
    client.post(url(child), {**GOOD, "checkpoint_id": source_checkpoint.pk}, format="json")
    shown = client.get(f"/api/v1/runs/{child.pk}/").json()["restore_report"]
    assert shown["not_restored"] == ["rng.python", "scheduler"]
    assert shown["details"]["scheduler"] == "scheduler rebuilt: state differs from the checkpoint's"
    assert (shown["checkpoint_id"], shown["unknown"], shown["reports"]) == (source_checkpoint.pk, [], 1)
    listed = client.get("/api/v1/runs/", {"project": child.project.slug}).json()["results"]
    assert {r["id"]: r["restore_report"] is not None for r in listed} == {child.pk: True, child.parent_id: False}


def test_a_part_the_checkpoint_cannot_describe_is_listed_not_declared_with_its_call(api, creator, child):
    line = "the checkpoint declares no data position: declare it with save_checkpoint(..., data_position=...)"
    body = {"parts": {"model": "restored", "data_position": "not_declared"}, "details": {"data_position": line}}
    client = api(creator)
    assert client.post(url(child), body, format="json").status_code == 201
    shown = client.get(f"/api/v1/runs/{child.pk}/").json()["restore_report"]
    assert (shown["not_declared"], shown["not_restored"], shown["unknown"]) == (["data_position"], [], [])
    assert shown["details"] == {"data_position": line}


def test_a_checkpoint_of_another_run_in_the_project_is_refused_and_the_runs_own_or_parents_are_taken(
    api, creator, child, source_checkpoint, project
):
    elsewhere = Checkpoint.objects.create(
        run=RunFactory(project=project), step=3, state=CheckpointState.COMPLETE, file_count=1
    )
    client = api(creator)
    answer = client.post(url(child), {**GOOD, "checkpoint_id": elsewhere.pk}, format="json")
    assert (answer.status_code, answer.json()["field"]) == (400, "checkpoint_id")
    assert "belongs to another run" in answer.json()["detail"]
    assert not RestoreReport.objects.filter(run=child).exists()
    own = Checkpoint.objects.create(run=child, step=30, state=CheckpointState.COMPLETE, file_count=1)
    parents = Checkpoint.objects.create(run_id=child.parent_id, step=10, state=CheckpointState.COMPLETE, file_count=1)
    for checkpoint in (own, parents, source_checkpoint):
        answer = client.post(url(child), {**GOOD, "checkpoint_id": checkpoint.pk}, format="json")
        assert answer.status_code in (200, 201), answer.content
        assert RestoreReport.objects.get(run=child).checkpoint_id == checkpoint.pk
