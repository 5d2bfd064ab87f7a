"""Sharded torch-dcp checkpoints through the API (docs/design/worker.md#distributed, #verify;
docs/design/checkpoints.md#a-checkpoint): complete only with every rank's shard.

A shard missing from the tar, one of a rank beyond the world size, or one whose bytes differ from the
declaration is refused at ``complete``: the checkpoint stays pending, never usable.
"""

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from tests.checkpoints.checkpoint_helpers import complete, declaration, make_tar, put_tar, register

SHARDS = {
    ".metadata": b"plan" * 50,
    "__0_0.distcp": b"rank zero" * 100,
    "__1_0.distcp": b"rank one" * 100,
    "mado-checkpoint.json": b'{"framework": "torch-dcp", "step": 20, "world_size": 2}',
}


@pytest.fixture
def client(api, creator):
    return api(creator)


def save_sharded(client, run, files: dict[str, bytes], *, world_size=2, declared: dict[str, bytes] | None = None):
    """Register (torch-dcp, ``world_size``), upload the tar of ``files`` and complete it declaring ``declared``."""
    created = register(client, run, 20, framework="torch-dcp", world_size=world_size)
    assert created.status_code == 201, created.content
    tar = make_tar(files)
    assert put_tar(client, created.json()["id"], tar).status_code == 200
    return created.json()["id"], complete(client, created.json()["id"], declaration(tar, declared or files))


def test_a_checkpoint_with_every_shard_completes_and_shows_its_world_size(client, run):
    checkpoint_id, done = save_sharded(client, run, SHARDS)
    assert done.status_code == 200, done.content
    body = client.get(f"/api/v1/checkpoints/{checkpoint_id}/").json()
    assert (body["state"], body["framework"], body["world_size"]) == ("complete", "torch-dcp", 2)
    assert {entry["path"] for entry in body["manifest"]} == set(SHARDS)


@pytest.mark.parametrize(
    ("files", "detail"),
    [
        ({k: v for k, v in SHARDS.items() if k != "__1_0.distcp"}, "no shard of rank(s) 1 of the world_size 2"),
        ({k: v for k, v in SHARDS.items() if k != ".metadata"}, "has no .metadata file"),
        ({**SHARDS, "__2_0.distcp": b"stale"}, "shards of rank(s) 2, beyond the world_size 2"),
    ],
    ids=["missing shard", "missing metadata", "stale shard of a larger world"],
)
def test_an_incomplete_set_of_shards_is_refused_and_stays_pending(client, run, files, detail):
    checkpoint_id, done = save_sharded(client, run, files)
    assert done.status_code == 400 and done.json()["field"] == "manifest"
    assert detail in done.json()["detail"]
    assert Checkpoint.objects.get(pk=checkpoint_id).state == CheckpointState.PENDING
    assert client.get(f"/api/v1/runs/{run.pk}/checkpoints/").json()["count"] == 0  # never usable


def test_an_altered_shard_is_refused(client, run):
    altered = {**SHARDS, "__1_0.distcp": b"X" + SHARDS["__1_0.distcp"][1:]}
    checkpoint_id, done = save_sharded(client, run, altered, declared=SHARDS)
    assert done.status_code == 400 and "mismatch" in done.json()["detail"]
    assert "__1_0.distcp" in done.json()["detail"]
    assert Checkpoint.objects.get(pk=checkpoint_id).state == CheckpointState.PENDING


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"framework": "torch-dcp"}, "needs world_size"),
        ({"framework": "torch-dcp", "world_size": 0}, "greater than or equal to 1"),
        ({"framework": "torch-dcp", "world_size": "two"}, "valid integer"),
        ({"framework": "torch-dcp", "world_size": True}, "valid integer"),
        ({"framework": "torch", "world_size": 2}, "only for framework 'torch-dcp'"),
    ],
    ids=["missing", "zero", "text", "boolean", "other framework"],
)
def test_a_bad_world_size_is_refused_naming_the_field(client, run, fields, detail):
    refused = register(client, run, 20, **fields)
    assert refused.status_code == 400 and refused.json()["field"] == "world_size", refused.content
    assert detail in refused.json()["detail"]
    assert not Checkpoint.objects.filter(run=run).exists()
