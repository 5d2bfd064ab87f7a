"""Usage figures follow every write and delete; retention policies preview and apply the same set; bulk delete and
by-hand delete answer to the same protections (docs/design/checkpoints.md#usage, #retention, #deletion)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints import selectors
from checkpoints.models import Checkpoint, CheckpointDeletion, CheckpointState, RetentionPolicy
from checkpoints.services.retention import retention_apply_scheduled
from checkpoints.usage import project_usage
from tests.checkpoints.checkpoint_helpers import save
from tests.factories import RunFactory
from tests.jobs.conftest import checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(api, creator, run, settings):
    """``run`` with complete checkpoints at steps 1..6 (keep count 2), a plain artifact, and a second Run resumed
    from step 2 (a resume source)."""
    settings.MMT_CHECKPOINT_KEEP_COUNT = 2
    client = api(creator)
    saved = {step: save(client, run, step, {"model.pt": b"w" * (100 * step)}) for step in range(1, 7)}
    assert client.put(f"/api/v1/runs/{run.pk}/artifacts/notes.txt", b"n" * 77, content_type="text/plain").status_code
    RunFactory(project=run.project, created_by=creator, name="resumed", source_checkpoint_id=saved[2]["id"])
    return {step: Checkpoint.objects.get(pk=body["id"]) for step, body in saved.items()}


def tar_bytes(checkpoints) -> int:
    return sum(c.tar_size for c in checkpoints)


def test_usage_equals_the_stored_bytes_and_follows_deletes(api, admin, project, run, seeded):
    client = api(admin)
    usage = client.get(f"/api/v1/projects/{project.slug}/usage/").json()
    assert usage["by_kind"]["tar"] == {"bytes": tar_bytes(seeded.values()), "files": 6}
    assert usage["by_kind"]["artifact"] == {"bytes": 77, "files": 1}
    assert usage["bytes"] == tar_bytes(seeded.values()) + 77
    assert usage["largest_runs"] == [{"run_id": run.pk, "name": "baseline", "bytes": usage["bytes"]}]
    # steps 1, 3, 4: neither in the keep count (5, 6) nor a resume source (2)
    assert usage["reclaimable"] == {"bytes": tar_bytes([seeded[1], seeded[3], seeded[4]]), "checkpoints": 3}
    assert usage["checkpoints_by_age"]["last_7_days"] == tar_bytes(seeded.values())
    assert client.delete(f"/api/v1/checkpoints/{seeded[1].pk}/").status_code == 204
    assert client.delete(f"/api/v1/runs/{run.pk}/artifacts/notes.txt").status_code == 204
    after = client.get(f"/api/v1/projects/{project.slug}/usage/").json()
    assert after["bytes"] == usage["bytes"] - seeded[1].tar_size - 77
    assert after["by_kind"]["tar"]["files"] == 5 and after["by_kind"]["artifact"] == {"bytes": 0, "files": 0}
    record = CheckpointDeletion.objects.get(checkpoint=seeded[1])
    assert (record.cause, record.bytes, record.deleted_by) == ("hand", seeded[1].tar_size, admin)


def test_the_reclaimable_figure_takes_the_same_queries_for_ten_times_the_checkpoints(project, creator, settings):
    """The usage page's "reclaimable" reads every protection of a Project at once, not a query or two per
    checkpoint (a Project with 100,000 runs would otherwise wait minutes for its storage page)."""
    settings.MMT_CHECKPOINT_KEEP_COUNT = 2

    def add_runs(count: int) -> None:
        for _ in range(count):
            run = RunFactory(project=project, created_by=creator)
            saved = [checkpoint(run, step) for step in range(1, 6)]
            RunFactory(project=project, created_by=creator, source_checkpoint=saved[0])

    def usage_queries() -> tuple[int, dict]:
        with CaptureQueriesContext(connection) as queries:
            usage = project_usage(project=project)
        return len(queries), usage["reclaimable"]["checkpoints"]

    add_runs(2)
    few, reclaimable = usage_queries()
    assert reclaimable == 2 * 2  # per run, steps 2 and 3: step 1 is a source, 4 and 5 are kept
    add_runs(18)
    many, reclaimable = usage_queries()
    assert reclaimable == 20 * 2 and many == few


def test_a_policy_preview_lists_what_apply_deletes_and_protections_win(api, admin, project, run, seeded):
    client = api(admin)
    put = client.put(f"/api/v1/projects/{project.slug}/retention-policy/", {"keep_last": 1}, format="json")
    assert put.status_code == 200, put.content
    assert Checkpoint.objects.filter(state=CheckpointState.DELETED).count() == 0, "saving deletes nothing"
    preview = client.post(f"/api/v1/projects/{project.slug}/retention-policy/preview/", {}, format="json").json()
    [plan] = preview["runs"]
    assert [c["step"] for c in plan["going"]] == [4, 3, 1]
    assert plan["bytes"] == preview["bytes"] == tar_bytes([seeded[1], seeded[3], seeded[4]])
    reasons = {c["step"]: c["reason"] for c in plan["protected"]}
    assert "source checkpoint of run resumed" in reasons[2] and "newest 2 complete checkpoints" in reasons[5]
    apply_url = f"/api/v1/projects/{project.slug}/retention-policy/apply/"
    applied = client.post(apply_url, {"plan": preview["plan"]}, format="json").json()
    assert sorted(c["id"] for c in applied["deleted"]) == sorted(c["id"] for c in plan["going"])
    assert applied["bytes"] == preview["bytes"] and applied["refused"] == []
    left = set(Checkpoint.objects.exclude(state=CheckpointState.DELETED).values_list("step", flat=True))
    assert left == {2, 5, 6}
    assert set(CheckpointDeletion.objects.values_list("cause", flat=True)) == {"policy"}
    again = client.post(apply_url, {"plan": preview["plan"]}, format="json").json()
    assert again["deleted"] == [] and again["bytes"] == 0
    assert all("is already deleted" in c["reason"] for c in again["refused"])


def test_each_rule_keeps_its_checkpoints(api, admin, creator, project, run, seeded):
    client = api(creator)
    points = [{"key": "loss", "value": v, "step": s} for s, v in {1: 0.1, 3: 0.9, 4: 0.2}.items()]
    assert client.post(f"/api/v1/runs/{run.pk}/metrics/", {"points": points}, format="json").status_code == 201
    admin_client = api(admin)

    def going(rules: dict) -> list[int]:
        answer = admin_client.post(f"/api/v1/projects/{project.slug}/retention-policy/preview/", rules, format="json")
        assert answer.status_code == 200, answer.content
        return sorted(c["step"] for r in answer.json()["runs"] for c in r["going"])

    assert going({"keep_best": 2, "best_metric": "loss"}) == [3]
    assert going({"keep_best": 1, "best_metric": "loss", "best_mode": "max"}) == [1, 4]
    assert going({"keep_every": 3}) == [1, 4]
    assert going({"keep_newer_days": 1}) == []
    Checkpoint.objects.filter(step__in=[1, 3]).update(created_at=timezone.now() - timedelta(days=3))
    assert going({"keep_newer_days": 1}) == [1, 3]


def test_a_policy_needs_a_rule_and_a_metric_for_keep_best(api, admin, member, project):
    url = f"/api/v1/projects/{project.slug}/retention-policy/"
    empty = api(admin).put(url, {}, format="json")
    assert (empty.status_code, empty.json()["field"]) == (400, "keep_last")
    best = api(admin).put(url, {"keep_best": 2}, format="json")
    assert (best.status_code, best.json()["field"]) == (400, "best_metric")
    assert api(member).put(url, {"keep_last": 2}, format="json").status_code == 403
    assert not RetentionPolicy.objects.exists()


def test_bulk_delete_of_runs_obeys_the_protections_and_is_idempotent(api, admin, project, run, seeded):
    url = f"/api/v1/projects/{project.slug}/checkpoints/bulk-delete/"
    first = api(admin).post(url, {"run_ids": [run.pk]}, format="json").json()
    assert sorted(c["step"] for c in first["deleted"]) == [1, 3, 4]
    assert {r["id"] for r in first["refused"]} == {seeded[2].pk, seeded[5].pk, seeded[6].pk}
    second = api(admin).post(url, {"run_ids": [run.pk]}, format="json").json()
    assert second["deleted"] == [] and len(second["refused"]) == 3


def test_the_runs_tables_button_asks_first_and_no_csrf_token_lands_in_a_url(client, admin, project, run, seeded):
    client.force_login(admin)
    table = client.get(f"/projects/{project.slug}/").content.decode()
    assert "csrfmiddlewaretoken" not in table.split('class="runs-select"')[1].split("</form>")[0]
    url = f"/projects/{project.slug}/checkpoints/bulk-delete/"
    asked = client.get(url, {"run": [run.pk]})
    assert asked.status_code == 200 and "csrfmiddlewaretoken" in asked.content.decode()
    assert Checkpoint.objects.filter(run=run).count() == len(seeded)  # asking deletes nothing
    done = client.post(url, {"run": [run.pk]})
    assert done.status_code == 302
    assert sorted(CheckpointDeletion.objects.values_list("step", flat=True)) == [1, 3, 4]


def test_every_deletion_asks_the_one_protection_check(api, admin, project, run, seeded, monkeypatch):
    """A protection added to ``checkpoint_delete_refusal`` (a registered model version, say) holds for the Delete
    button, bulk delete and policies alike."""
    real = selectors.checkpoint_delete_refusal

    def with_registry(*, checkpoint, **facts):
        if checkpoint.step == 3:
            return "The checkpoint at step 3 is behind a registered model version."
        return real(checkpoint=checkpoint, **facts)

    monkeypatch.setattr(selectors, "checkpoint_delete_refusal", with_registry)
    client = api(admin)
    by_hand = client.delete(f"/api/v1/checkpoints/{seeded[3].pk}/")
    assert by_hand.status_code == 409 and "registered model version" in by_hand.json()["detail"]
    preview = client.post(f"/api/v1/projects/{project.slug}/retention-policy/preview/", {"keep_last": 1}, format="json")
    assert 3 not in [c["step"] for c in preview.json()["runs"][0]["going"]]
    bulk_url = f"/api/v1/projects/{project.slug}/checkpoints/bulk-delete/"
    bulk = client.post(bulk_url, {"run_ids": [run.pk]}, format="json")
    assert seeded[3].pk in {r["id"] for r in bulk.json()["refused"]}
    assert Checkpoint.objects.get(pk=seeded[3].pk).state == CheckpointState.COMPLETE


def test_beat_applies_only_a_policy_an_admin_scheduled_once_a_day(api, admin, project, run, seeded):
    url = f"/api/v1/projects/{project.slug}/retention-policy/"
    assert api(admin).put(url, {"keep_last": 1}, format="json").status_code == 200
    assert retention_apply_scheduled() == 0
    assert not Checkpoint.objects.filter(state=CheckpointState.DELETED).exists()
    assert api(admin).put(url, {"keep_last": 1, "scheduled": True}, format="json").status_code == 200
    assert retention_apply_scheduled() == 1
    assert set(CheckpointDeletion.objects.values_list("cause", flat=True)) == {"schedule"}
    assert retention_apply_scheduled() == 0, "applied at most once a day"


def test_a_runs_usage_and_a_checkpoints_stored_bytes(api, viewer, run, seeded):
    usage = api(viewer).get(f"/api/v1/runs/{run.pk}/usage/").json()
    assert usage["by_kind"]["tar"] == {"bytes": tar_bytes(seeded.values()), "files": 6}
    assert usage["bytes"] == tar_bytes(seeded.values()) + 77
    shown = api(viewer).get(f"/api/v1/checkpoints/{seeded[3].pk}/").json()
    assert shown["stored_bytes"] == seeded[3].tar_size and shown["verified_at"] is None
