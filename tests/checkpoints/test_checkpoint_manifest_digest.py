"""``complete`` with ``manifest_sha256``: a checkpoint of any file count is declared in a small body, and its
manifest is what the server's pass over the tar found (docs/design/checkpoints.md#a-checkpoint;
docs/design/worker.md#verify)."""

import io
import json

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking.tarverify import ManifestFile, manifest_digest
from tests.checkpoints.checkpoint_helpers import FILES, complete, make_tar, put_tar, register, sha

pytestmark = pytest.mark.django_db
MANY = {f"shards/{index:05d}.bin": b"" for index in range(30_000)}


def digest(files: dict[str, bytes]) -> str:
    return manifest_digest(ManifestFile(path, len(data), sha(data)) for path, data in files.items())


@pytest.fixture
def client(api, creator):
    return api(creator)


def uploaded(client, run, files: dict[str, bytes]) -> tuple[int, bytes]:
    checkpoint_id = register(client, run, 5).json()["id"]
    tar = make_tar(files)
    assert put_tar(client, checkpoint_id, tar).status_code == 200
    return checkpoint_id, tar


def test_thirty_thousand_files_complete_with_the_digest_of_their_manifest(client, run):
    """The body with every file would be ~3 MB, over Django's request limit; the digest is 64 hex digits."""
    checkpoint_id, tar = uploaded(client, run, MANY)
    body = {"tar_size": len(tar), "tar_sha256": sha(tar), "manifest_sha256": digest(MANY)}
    response = complete(client, checkpoint_id, body)
    assert response.status_code == 200, response.content
    stored = Checkpoint.objects.get(pk=checkpoint_id)
    assert stored.state == CheckpointState.COMPLETE and stored.file_count == 30_000
    assert stored.manifest.count() == 30_000 and stored.manifest.filter(path="shards/29999.bin").exists()
    assert complete(client, checkpoint_id, body).status_code == 200, "the same declaration again is idempotent"


def test_a_digest_of_other_files_is_refused_and_the_checkpoint_stays_pending(client, run):
    checkpoint_id, tar = uploaded(client, run, FILES)
    other = digest({**FILES, "model.pt": b"other weights"})
    response = complete(client, checkpoint_id, {"tar_size": len(tar), "tar_sha256": sha(tar), "manifest_sha256": other})
    assert response.status_code == 400
    assert response.json()["detail"].startswith(f"Checkpoint {checkpoint_id} manifest mismatch: the tar's 3 files")
    assert response.json()["field"] == "manifest"
    assert Checkpoint.objects.get(pk=checkpoint_id).state == CheckpointState.PENDING


@pytest.mark.parametrize(
    "members, message",
    [
        ({}, "send either manifest"),
        ({"manifest": [], "manifest_sha256": "0" * 64}, "send either manifest"),
        ({"manifest_sha256": "not hex"}, "manifest_sha256 must be 64 hexadecimal digits"),
    ],
)
def test_exactly_one_well_formed_manifest_declaration_is_accepted(client, run, members, message):
    checkpoint_id, tar = uploaded(client, run, FILES)
    response = complete(client, checkpoint_id, {"tar_size": len(tar), "tar_sha256": sha(tar), **members})
    assert response.status_code == 400 and message in response.json()["detail"]


def test_a_complete_checkpoint_answers_a_digest_replay_by_what_it_holds(client, run):
    checkpoint_id, tar = uploaded(client, run, FILES)
    inline = [{"path": p, "size": len(d), "sha256": sha(d)} for p, d in FILES.items()]
    assert (
        complete(client, checkpoint_id, {"tar_size": len(tar), "tar_sha256": sha(tar), "manifest": inline}).status_code
        == 200
    )
    same = {"tar_size": len(tar), "tar_sha256": sha(tar), "manifest_sha256": digest(FILES)}
    assert complete(client, checkpoint_id, same).status_code == 200
    other = {**same, "manifest_sha256": digest({"x": b""})}
    assert complete(client, checkpoint_id, other).status_code == 409


@pytest.mark.parametrize("files, outcome", [(FILES, "complete"), ({**FILES, "b.txt": b"HELLO"}, "mismatch")])
def test_the_direct_upload_verification_checks_a_declared_digest(run, creator, files, outcome):
    """The S3 path: the task verifies the stored tar and compares its files with the declared digest."""
    from checkpoints import services, storage

    checkpoint, _ = services.checkpoint_register(actor=creator, run=run, step=7, idempotency_key="d")
    tar = make_tar(FILES)
    key = storage.blob_write(source=io.BytesIO(tar), prefix=f"runs/{run.pk}").key
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        received={"storage_key": key, "upload_id": "u", "part_size": 8 << 20, "tar_size": len(tar), "uploaded": True},
        declared={"tar_size": len(tar), "tar_sha256": sha(tar), "manifest_sha256": digest(files)},
    )
    assert services.checkpoint_verify_upload(checkpoint_id=checkpoint.pk) == outcome
    row = Checkpoint.objects.get(pk=checkpoint.pk)
    if outcome == "complete":
        assert row.state == CheckpointState.COMPLETE and row.manifest.count() == len(FILES)
    else:
        assert row.state == CheckpointState.PENDING and "manifest mismatch: the tar's 3 files" in row.error


@pytest.mark.parametrize("path", ["\ud800.pt", "caf\udce9.pt", "a\u0000b", "Model.pt"])
def test_a_manifest_path_the_format_refuses_answers_400_naming_the_entry(client, run, path):
    """Lone surrogates (valid JSON, not UTF-8), NUL, and a case-folded twin of another entry."""
    checkpoint_id, tar = uploaded(client, run, FILES)
    entries = [{"path": "model.pt", "size": 1, "sha256": "0" * 64}, {"path": path, "size": 1, "sha256": "0" * 64}]
    body = json.dumps({"tar_size": len(tar), "tar_sha256": sha(tar), "manifest": entries})  # "\ud800" escaped
    response = client.post(f"/api/v1/checkpoints/{checkpoint_id}/complete/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "manifest[1].path"
