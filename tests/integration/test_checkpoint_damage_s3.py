"""On a real S3-compatible server (moto's) with PostgreSQL: a stored checkpoint tar deleted, truncated, extended or
altered is named by the first download, before any byte (an S3 HEAD, then one read back), and by the worker; once
read back whole and matched, a download is one HEAD until the object is rewritten
(docs/design/checkpoints.md#damage)."""

import pytest

from checkpoints.models import Artifact, Checkpoint, CheckpointState
from checkpoints.services.scrub import checkpoint_scrub_pass
from tests.checkpoints.checkpoint_helpers import save
from tests.integration.conftest import S3_BUCKET as BUCKET

pytestmark = pytest.mark.django_db(transaction=True)


def _key(checkpoint: Checkpoint) -> str:
    return f"prefix/{checkpoint.artifact.storage_key}"


def _body(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _altered(tar: bytes) -> bytes:
    return tar[:700] + bytes([tar[700] ^ 0xFF]) + tar[701:]


DAMAGE = {
    "deleted": (lambda s3, key, tar: s3.delete_object(Bucket=BUCKET, Key=key), "the stored object is missing"),
    "truncated": (
        lambda s3, key, tar: s3.put_object(Bucket=BUCKET, Key=key, Body=tar[:-100]),
        "the stored object is {short} bytes, {size} were verified",
    ),
    "extended": (
        lambda s3, key, tar: s3.put_object(Bucket=BUCKET, Key=key, Body=tar + b"appended"),
        "the stored object is {long} bytes, {size} were verified",
    ),
    "altered": (
        lambda s3, key, tar: s3.put_object(Bucket=BUCKET, Key=key, Body=_altered(tar)),
        "the stored object's SHA-256 is ",
    ),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_tar_on_s3_is_named_by_the_first_download(
    postgres, s3_bucket, api, creator, member, run, kind, corrupt_events
):
    checkpoint = Checkpoint.objects.get(pk=save(api(creator), run, 10)["id"])
    key, size = _key(checkpoint), checkpoint.tar_size
    damage, expected = DAMAGE[kind]
    damage(s3_bucket, key, _body(s3_bucket, key) if kind != "deleted" else b"")
    reason = "the tar: " + expected.format(short=size - 100, long=size + 8, size=size)
    answer = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert answer.status_code == 410 and answer.json()["error"] == "checkpoint_corrupt"
    assert answer.json()["detail"].startswith(f"checkpoint {checkpoint.pk} is corrupt: {reason}")
    checkpoint.refresh_from_db()
    assert checkpoint.state == CheckpointState.CORRUPT and checkpoint.error.startswith(reason)
    assert corrupt_events == [(checkpoint.pk, checkpoint.error)]
    assert api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar").status_code == 410
    assert checkpoint_scrub_pass(rate=10**12).corrupt == [] and len(corrupt_events) == 1, "named once"


def test_an_intact_tar_on_s3_is_trusted_by_its_fingerprint_until_rewritten(
    postgres, s3_bucket, api, creator, member, run, corrupt_events
):
    checkpoint = Checkpoint.objects.get(pk=save(api(creator), run, 10)["id"])
    first = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert first.status_code == 200 and len(b"".join(first.streaming_content)) == checkpoint.tar_size
    recorded = Artifact.objects.get(pk=checkpoint.artifact_id).stored_fingerprint
    assert recorded.startswith(f"s3:{checkpoint.tar_size}:"), "an S3 object's ETag settles at once"
    key = _key(checkpoint)
    s3_bucket.put_object(Bucket=BUCKET, Key=key, Body=_altered(_body(s3_bucket, key)))
    answer = api(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")
    assert answer.status_code == 410 and "the stored object's SHA-256 is" in answer.json()["detail"]
    assert len(corrupt_events) == 1
