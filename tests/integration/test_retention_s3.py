"""Usage and retention on PostgreSQL and a real S3-compatible server (moto's): the usage figures equal the bytes the
bucket holds, a policy's preview lists exactly what apply deletes, the deleted objects leave the bucket and the
protected ones stay, and one plan applied twice at once deletes once (docs/design/checkpoints.md#usage, #retention,
#deletion)."""

import pytest

from checkpoints.models import Checkpoint, CheckpointDeletion, CheckpointState
from checkpoints.services.retention import retention_apply
from tests.checkpoints.checkpoint_helpers import save
from tests.factories import RunFactory
from tests.integration.concurrency import together
from tests.integration.conftest import S3_BUCKET

pytestmark = pytest.mark.django_db(transaction=True)


def bucket_bytes(client) -> dict[str, int]:
    """``{key: size}`` of every object in the test bucket."""
    return {o["Key"]: o["Size"] for o in client.list_objects_v2(Bucket=S3_BUCKET).get("Contents", [])}


def stored_key(checkpoint: Checkpoint) -> str:
    return f"prefix/{checkpoint.artifact.storage_key}"


def test_usage_equals_the_bucket_and_apply_deletes_exactly_the_preview(
    postgres, s3_bucket, api, admin, creator, project, settings
):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 2
    client = api(creator)
    runs = [RunFactory(project=project, created_by=creator, name=name) for name in ("long", "short")]
    saved = {}
    for run, steps in zip(runs, (range(1, 7), range(1, 4))):
        for step in steps:
            body = save(client, run, step, {"model.pt": bytes([step]) * (3000 * step), "rng.pt": b"r" * 99})
            saved[(run.name, step)] = Checkpoint.objects.get(pk=body["id"])
    put = client.put(f"/api/v1/runs/{runs[0].pk}/artifacts/eval.json", b"{}" * 500, content_type="application/json")
    assert put.status_code == 201, put.content
    source = saved[("long", 2)]
    RunFactory(project=project, created_by=creator, name="resumed", source_checkpoint=source)
    registered = saved[("long", 3)]  # the fact the model registry writes when a version points at it
    Checkpoint.objects.filter(pk=registered.pk).update(registered_as="net v1")

    usage = api(admin).get(f"/api/v1/projects/{project.slug}/usage/").json()
    assert usage["bytes"] == sum(bucket_bytes(s3_bucket).values())
    assert usage["files"] == len(bucket_bytes(s3_bucket)) == 10

    url = f"/api/v1/projects/{project.slug}/retention-policy/"
    assert api(admin).put(url, {"keep_last": 1}, format="json").status_code == 200
    preview = api(admin).post(f"{url}preview/", {}, format="json").json()
    going = {c["id"] for r in preview["runs"] for c in r["going"]}
    expected = {saved[("long", s)].pk for s in (1, 4)} | {saved[("short", 1)].pk}
    assert going == expected
    protected = {c["id"]: c["reason"] for r in preview["runs"] for c in r["protected"]}
    assert "registered as model version net v1" in protected[registered.pk]
    going_keys = {stored_key(c) for c in Checkpoint.objects.filter(pk__in=going)}
    kept_keys = set(bucket_bytes(s3_bucket)) - going_keys

    applied = api(admin).post(f"{url}apply/", {"plan": preview["plan"]}, format="json").json()
    assert {c["id"] for c in applied["deleted"]} == going
    assert applied["bytes"] == preview["bytes"]
    left = bucket_bytes(s3_bucket)
    assert set(left) == kept_keys, "the deleted checkpoints' objects are gone, every other object stays"
    assert stored_key(source) in left and stored_key(saved[("long", 6)]) in left
    assert stored_key(registered) in left
    assert set(Checkpoint.objects.filter(state=CheckpointState.DELETED).values_list("pk", flat=True)) == going
    after = api(admin).get(f"/api/v1/projects/{project.slug}/usage/").json()
    assert after["bytes"] == sum(left.values()) == usage["bytes"] - preview["bytes"]


def test_one_plan_applied_twice_at_once_deletes_each_checkpoint_once(
    postgres, s3_bucket, api, admin, creator, project, settings
):
    """A double-submitted apply: both requests run together; the checkpoints go once, each with one record."""
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    run = RunFactory(project=project, created_by=creator, name="twice")
    for step in range(1, 5):
        save(api(creator), run, step, {"model.pt": bytes([step]) * 500})
    url = f"/api/v1/projects/{project.slug}/retention-policy/"
    assert api(admin).put(url, {"keep_last": 1}, format="json").status_code == 200
    plan = api(admin).post(f"{url}preview/", {}, format="json").json()["plan"]
    call = (retention_apply, {"actor": admin, "project": project, "plan": plan})
    outcomes = together(call, call)
    assert [error for _, error in outcomes] == [None, None]
    assert sorted(len(applied.deleted) for applied, _ in outcomes) == [0, 3]
    assert sorted(CheckpointDeletion.objects.values_list("step", flat=True)) == [1, 2, 3]
    assert len(bucket_bytes(s3_bucket)) == 1
