"""API: register → upload → complete, idempotent retries, every "Bad input" refusal
(docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#verify, #refusal)."""

import io
import os
import tarfile

import pytest

from checkpoints.models import Artifact, Checkpoint, CheckpointState, ManifestEntry
from tests.checkpoints.checkpoint_helpers import (
    FILES,
    complete,
    declaration,
    make_tar,
    manifest_of,
    member,
    put_tar,
    register,
    save,
    sha,
)

TAR = make_tar()


def stored_files(settings):
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.fixture
def client(api, creator):
    return api(creator)


@pytest.fixture
def pending(client, run):
    response = register(client, run, 10, key="k-10", framework="torch", includes_optimizer=True)
    assert response.status_code == 201
    return response.json()


@pytest.fixture
def earlier(client, run, django_capture_on_commit_callbacks):
    """A complete checkpoint at step 5: nothing a refused save does may change it."""
    with django_capture_on_commit_callbacks(execute=True):
        return save(client, run, 5)


def snapshot(run):
    rows = Checkpoint.objects.filter(run=run, state=CheckpointState.COMPLETE).order_by("step")
    return (
        [(c.pk, c.step, c.tar_sha256, c.tar_size, c.artifact_id, c.file_count) for c in rows],
        sorted(Artifact.objects.filter(run=run).values_list("path", "sha256", "storage_key")),
        sorted(ManifestEntry.objects.filter(checkpoint__run=run).values_list("checkpoint_id", "path", "sha256")),
    )


# --- the happy path ---------------------------------------------------------------------


def test_a_save_is_register_upload_complete_and_only_then_usable(client, run, pending, settings):
    assert pending["state"] == "pending" and pending["step"] == 10 and pending["framework"] == "torch"
    assert pending["includes_optimizer"] is True and pending["within_keep_count"] is False
    assert client.get(f"/api/v1/runs/{run.pk}/checkpoints/").json()["count"] == 0
    uploaded = put_tar(client, pending["id"], TAR)
    assert uploaded.status_code == 200 and uploaded.json() == {"received_bytes": len(TAR), "sha256": sha(TAR)}
    assert client.get(f"/api/v1/runs/{run.pk}/checkpoints/").json()["count"] == 0
    done = complete(client, pending["id"], declaration(TAR))
    assert done.status_code == 200 and done.json()["state"] == "complete"
    detail = client.get(f"/api/v1/checkpoints/{pending['id']}/").json()
    assert detail["file_count"] == 3 and detail["total_bytes"] == sum(len(d) for d in FILES.values())
    assert detail["tar_size"] == len(TAR) and detail["tar_sha256"] == sha(TAR) and detail["error"] == ""
    assert detail["manifest"] == manifest_of() and detail["within_keep_count"] is True
    assert detail["artifact_path"] == "checkpoints/step-10.tar" and detail["created_by"] == "carol-creator"
    artifact = Artifact.objects.get(run=run)
    assert (artifact.path, artifact.size, artifact.sha256) == ("checkpoints/step-10.tar", len(TAR), sha(TAR))
    assert stored_files(settings) == [artifact.storage_key]
    listed = client.get(f"/api/v1/runs/{run.pk}/checkpoints/").json()["results"]
    assert [c["id"] for c in listed] == [pending["id"]]


def test_a_tar_built_by_the_sdk_is_accepted(client, run, pending, tmp_path):
    from mado_tracking.tarstream import CheckpointTar

    (tmp_path / "ckpt" / "sub").mkdir(parents=True)
    (tmp_path / "ckpt" / "model.pt").write_bytes(os.urandom(3 << 20))
    (tmp_path / "ckpt" / "sub" / ("long-name-" * 15 + ".bin")).write_bytes(b"x" * 513)
    tar = CheckpointTar(tmp_path / "ckpt")
    data = b"".join(tar)
    assert put_tar(client, pending["id"], data).status_code == 200
    body = {"tar_size": len(data), "manifest": tar.manifest}  # the SDK leaves the tar's SHA-256 to the server
    done = complete(client, pending["id"], body).json()
    assert done["file_count"] == 2 and done["state"] == "complete"
    assert done["tar_sha256"] == sha(data)  # recorded from the server's own pass over the bytes
    assert complete(client, pending["id"], body).status_code == 200  # replayed: the same completion
    assert complete(client, pending["id"], {**body, "tar_sha256": "0" * 64}).status_code == 409


def test_an_upload_never_reads_the_whole_body_into_memory(client, pending, monkeypatch):
    from django.core.handlers.wsgi import WSGIRequest

    monkeypatch.setattr(WSGIRequest, "body", property(lambda self: pytest.fail("request.body read the whole upload")))
    assert put_tar(client, pending["id"], TAR).status_code == 200


# --- idempotent retries and duplicates -------------------------------------------------------


def test_the_same_idempotency_key_returns_the_same_checkpoint(client, run, pending):
    again = register(client, run, 10, key="k-10")
    assert again.status_code == 200 and again.json()["id"] == pending["id"]
    assert Checkpoint.objects.filter(run=run).count() == 1


@pytest.mark.parametrize("key", ["another-key", None])
def test_a_second_registration_of_a_step_answers_409(client, run, pending, key):
    response = register(client, run, 10, key=key)
    assert response.status_code == 409 and response.json()["detail"] == "step 10 is already saved in this run"
    assert response.json()["field"] == "step"


def test_a_duplicate_step_of_a_complete_checkpoint_answers_409(client, run, earlier):
    response = register(client, run, 5, key="fresh")
    assert response.status_code == 409 and "step 5 is already saved" in response.json()["detail"]


def test_an_idempotency_key_reused_for_another_step_is_refused(client, run, pending):
    response = register(client, run, 11, key="k-10")
    assert response.status_code == 409 and response.json()["field"] == "Idempotency-Key"


@pytest.mark.parametrize("step", [-1, "ten", None, 1.5])
def test_a_bad_step_is_refused_naming_the_field(client, run, step):
    response = register(client, run, step)
    assert response.status_code == 400 and response.json()["field"] == "step"
    assert not Checkpoint.objects.exists()


def test_a_retried_upload_replaces_the_pending_one_and_keeps_one_blob(
    client, pending, settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        assert put_tar(client, pending["id"], make_tar({"a.bin": b"first"})).status_code == 200
    first = stored_files(settings)
    with django_capture_on_commit_callbacks(execute=True):
        assert put_tar(client, pending["id"], TAR).status_code == 200
    assert len(first) == 1 and len(stored_files(settings)) == 1 and stored_files(settings) != first
    assert complete(client, pending["id"], declaration(TAR)).status_code == 200


def test_completing_again_with_the_same_declaration_is_idempotent(client, pending):
    put_tar(client, pending["id"], TAR)
    first = complete(client, pending["id"], declaration(TAR))
    again = complete(client, pending["id"], declaration(TAR))
    assert again.status_code == 200 and again.json() == first.json()
    assert ManifestEntry.objects.filter(checkpoint_id=pending["id"]).count() == 3


def test_a_complete_checkpoint_refuses_another_tar_or_declaration(client, pending, settings):
    put_tar(client, pending["id"], TAR)
    complete(client, pending["id"], declaration(TAR))
    before = stored_files(settings)
    response = put_tar(client, pending["id"], TAR)
    assert response.status_code == 409 and "complete" in response.json()["detail"]
    other = {**declaration(TAR), "manifest": manifest_of()[:2]}
    assert complete(client, pending["id"], other).status_code == 409
    assert stored_files(settings) == before


def test_completing_before_any_upload_answers_409(client, pending):
    response = complete(client, pending["id"], declaration(TAR))
    assert response.status_code == 409 and "PUT" in response.json()["detail"]


# --- bad input: the tar itself (refused while it streams in) ------------------------------------


BAD_TARS = {
    "not a tar": (b"PK\x03\x04 this is a zip file, not a tar " * 100, "tar", ""),
    "symbolic link": (
        make_tar(extra=[member("link", kind=tarfile.SYMTYPE, linkname="model.pt")]),
        "tar",
        "symbolic link",
    ),
    "hard link": (make_tar(extra=[member("hard", kind=tarfile.LNKTYPE, linkname="model.pt")]), "tar", "hard link"),
    "FIFO": (make_tar(extra=[member("pipe", kind=tarfile.FIFOTYPE)]), "tar", "FIFO"),
    "dot-dot path": (make_tar({"../evil.pt": b"x"}), "path", "'../evil.pt'"),
    "absolute path": (make_tar({"/etc/evil.pt": b"x"}), "path", "'/etc/evil.pt'"),
    "duplicate path": (make_tar(extra=[member("model.pt", b"again")]), "path", "appears twice"),
    "truncated archive": (TAR[:1500], "tar", "truncated"),
    "trailing garbage": (TAR + b"\x01" * 512, "tar", "after the end"),
}


@pytest.mark.parametrize("name", list(BAD_TARS))
def test_a_bad_tar_is_refused_naming_what_differed_and_nothing_is_kept(client, run, earlier, settings, name):
    data, what, detail = BAD_TARS[name]
    created = register(client, run, 10, key="k").json()
    before, files_before = snapshot(run), stored_files(settings)
    response = put_tar(client, created["id"], data)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["detail"].startswith(f"Checkpoint {created['id']} {what} mismatch: ") and detail in body["detail"]
    checkpoint = Checkpoint.objects.get(pk=created["id"])
    assert checkpoint.state == CheckpointState.PENDING and checkpoint.received == {}
    assert checkpoint.error == body["detail"]
    assert stored_files(settings) == files_before and snapshot(run) == before
    assert complete(client, created["id"], declaration(data)).status_code == 409


def test_an_upload_cut_off_half_way_is_not_kept(client, run, earlier, settings):
    created = register(client, run, 10).json()
    before, files_before = snapshot(run), stored_files(settings)
    half = io.BytesIO(TAR[: len(TAR) // 2])
    response = put_tar(client, created["id"], TAR, **{"wsgi.input": half, "CONTENT_LENGTH": str(len(TAR))})
    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"Checkpoint {created['id']} size mismatch: upload cut off: received {len(TAR) // 2} of {len(TAR)} bytes"
    )
    assert Checkpoint.objects.get(pk=created["id"]).state == CheckpointState.PENDING
    assert stored_files(settings) == files_before and snapshot(run) == before


class BrokenSocket(io.RawIOBase):
    def __init__(self, data: bytes, fail_after: int):
        self.data, self.fail_after, self.sent = data, fail_after, 0

    def read(self, size=-1):
        if self.sent >= self.fail_after:
            raise ConnectionResetError("connection reset by peer")
        chunk = self.data[self.sent : self.sent + min(size, self.fail_after - self.sent)]
        self.sent += len(chunk)
        return chunk


def test_a_connection_reset_mid_upload_is_a_cut_off_and_keeps_nothing(client, run, settings):
    created = register(client, run, 10).json()
    body = os.urandom(1 << 20)
    tar = make_tar({"big.bin": body})
    source = BrokenSocket(tar, fail_after=len(tar) // 2)
    response = put_tar(client, created["id"], tar, **{"wsgi.input": source, "CONTENT_LENGTH": str(len(tar))})
    assert response.status_code == 400 and "size mismatch: upload cut off" in response.json()["detail"]
    assert stored_files(settings) == []


def test_a_failed_retry_keeps_the_earlier_good_upload(client, pending):
    assert put_tar(client, pending["id"], TAR).status_code == 200
    assert put_tar(client, pending["id"], b"garbage" * 100).status_code == 400
    assert complete(client, pending["id"], declaration(TAR)).status_code == 200


# --- bad input: the declaration at complete -------------------------------------------------


def _with(manifest=None, **changes):
    body = declaration(TAR)
    if manifest is not None:
        body["manifest"] = manifest
    body.update(changes)
    return body


_M = manifest_of()
BAD_DECLARATIONS = {
    "tar size": (_with(tar_size=len(TAR) + 1), 400, "tar_size", "size mismatch: the stored tar is"),
    "tar sha256": (_with(tar_sha256="0" * 64), 400, "tar_sha256", "sha256 mismatch: the stored tar's SHA-256"),
    "extra file": (
        _with(_M + [{"path": "zzz", "size": 1, "sha256": "a" * 64}]),
        400,
        "manifest",
        "manifest mismatch: missing from the tar: 'zzz'",
    ),
    "missing file": (_with(_M[1:]), 400, "manifest", "manifest mismatch: extra file"),
    "file size": (
        _with([{**_M[0], "size": 1}] + _M[1:]),
        400,
        "manifest",
        "size mismatch: 'empty.bin' is 0 bytes in the tar, 1 in the manifest",
    ),
    "file sha256": (
        _with(_M[:1] + [{**_M[1], "sha256": "b" * 64}] + _M[2:]),
        400,
        "manifest",
        "sha256 mismatch: 'model.pt' has SHA-256",
    ),
    "dot-dot path": (_with([{**_M[0], "path": "../x"}]), 400, "manifest[0].path", "not a normalised relative path"),
    "absolute path": (_with([{**_M[0], "path": "/x"}]), 400, "manifest[0].path", "absolute"),
    "duplicate path": (_with([_M[0], _M[0]]), 400, "manifest[1].path", "appears twice"),
    "bad digest": (_with(tar_sha256="xyz"), 400, "tar_sha256", "64 hexadecimal"),
    "negative size": (_with([{**_M[0], "size": -1}]), 400, "manifest[0].size", "non-negative"),
    "not a list": (_with(manifest={"a": 1}), 400, "manifest", ""),
}


@pytest.mark.parametrize("name", list(BAD_DECLARATIONS))
def test_a_declaration_that_differs_is_refused_naming_what_and_the_checkpoint_stays_pending(
    client, run, earlier, pending, name
):
    body, code, field, detail = BAD_DECLARATIONS[name]
    assert put_tar(client, pending["id"], TAR).status_code == 200
    before = snapshot(run)
    response = complete(client, pending["id"], body)
    assert response.status_code == code, response.content
    assert response.json()["field"] == field and detail in response.json()["detail"]
    if "mismatch" in detail:
        assert response.json()["detail"].startswith(f"Checkpoint {pending['id']} ")
    assert Checkpoint.objects.get(pk=pending["id"]).state == CheckpointState.PENDING
    assert snapshot(run) == before
    assert complete(client, pending["id"], declaration(TAR)).status_code == 200


def test_upload_parts_needs_the_s3_storage(client, pending):
    response = client.post(f"/api/v1/checkpoints/{pending['id']}/upload-parts/", {"tar_size": 100}, format="json")
    assert response.status_code == 409 and "MADO_STORAGE=s3" in response.json()["detail"]
    assert client.get(f"/api/v1/checkpoints/{pending['id']}/").json()["direct_upload"] is False


# --- download with Range (docs/design/worker.md#fetch) ------------------------------------------------------------


def test_two_ranged_gets_concatenate_to_the_tar(api, viewer, run, client):
    files = {"model.pt": os.urandom((1 << 20) + 777)}
    big = make_tar(files)
    checkpoint = save(client, run, 10, files=files)
    url = f"/api/v1/checkpoints/{checkpoint['id']}/tar"
    reader = api(viewer)
    first = reader.get(url, HTTP_RANGE="bytes=0-700000")
    assert first.status_code == 206 and first["Content-Range"] == f"bytes 0-700000/{len(big)}"
    rest = reader.get(url, HTTP_RANGE="bytes=700001-", HTTP_IF_RANGE=first["ETag"])
    assert rest.status_code == 206
    joined = b"".join(first.streaming_content) + b"".join(rest.streaming_content)
    assert joined == big and first["ETag"] == f'"{sha(big)}"'
    whole = reader.get(url)
    assert whole.status_code == 200 and b"".join(whole.streaming_content) == big
    past = reader.get(url, HTTP_RANGE=f"bytes={len(big)}-")
    assert past.status_code == 416 and past["Content-Range"] == f"bytes */{len(big)}"


def test_a_pending_checkpoint_has_no_tar_to_download(client, pending):
    put_tar(client, pending["id"], TAR)
    response = client.get(f"/api/v1/checkpoints/{pending['id']}/tar")
    assert response.status_code == 409 and "pending" in response.json()["detail"]
