"""API: runs/{id}/artifacts/ streamed PUT, ranged GET, DELETE, list (docs/api.md; docs/design/checkpoints.md#deletion;
docs/design/worker.md#fetch)."""

import hashlib
import os

import pytest
from django.core.files.storage import storages

from checkpoints.models import Artifact, Checkpoint
from tests.factories import RunFactory

BLOB = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes: crosses a chunk boundary
SHA = hashlib.sha256(BLOB).hexdigest()


def url(run, path="checkpoints/step-10.tar"):
    return f"/api/v1/runs/{run.pk}/artifacts/{path}"


def put(client, run, data=BLOB, path="checkpoints/step-10.tar", **headers):
    return client.put(url(run, path), data=data, content_type="application/octet-stream", **headers)


def stored_files(settings):
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def body(response) -> bytes:
    return b"".join(response.streaming_content)


@pytest.fixture
def artifact(run, creator, api):
    assert put(api(creator), run).status_code == 201
    return Artifact.objects.get(run=run)


# --- permission matrix ------------------------------------------------------------


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 201),
        ("member", 403),
        ("creator", 201),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_artifact_put_permission_matrix(client_as, run, settings, role, status):
    response = put(client_as(role), run)
    assert response.status_code == status
    assert Artifact.objects.filter(run=run).exists() == (status == 201)
    assert len(stored_files(settings)) == (1 if status == 201 else 0)


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("member", 200),
        ("creator", 200),
        ("viewer", 200),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_artifact_get_permission_matrix(client_as, artifact, run, role, status):
    response = client_as(role).get(url(run))
    assert response.status_code == status
    if status == 200:
        assert body(response) == BLOB


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("member", 200),
        ("creator", 200),
        ("viewer", 200),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_artifact_list_permission_matrix(client_as, artifact, run, role, status):
    response = client_as(role).get(f"/api/v1/runs/{run.pk}/artifacts/")
    assert response.status_code == status
    if status == 200:
        [row] = response.json()["results"]
        assert (row["path"], row["size"], row["sha256"]) == ("checkpoints/step-10.tar", len(BLOB), SHA)
        assert set(row) == {"path", "size", "sha256", "created_at"}


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 204),
        ("member", 403),
        ("creator", 403),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_only_a_project_admin_deletes_an_artifact(
    client_as, artifact, run, settings, django_capture_on_commit_callbacks, role, status
):
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as(role).delete(url(run))
    assert response.status_code == status
    assert Artifact.objects.filter(pk=artifact.pk).exists() == (status != 204)
    assert stored_files(settings) == ([] if status == 204 else [artifact.storage_key])


# --- upload ---------------------------------------------------------------------------


def test_an_upload_is_hashed_counted_and_stored_under_a_fresh_key(api, creator, run):
    response = put(api(creator), run, HTTP_X_MADO_SHA256=SHA.upper())
    assert response.status_code == 201
    assert response.json()["sha256"] == SHA and response.json()["size"] == len(BLOB)
    artifact = Artifact.objects.get(run=run)
    assert artifact.storage_key.startswith(f"runs/{run.pk}/") and artifact.project_id == run.project_id
    with storages["artifacts"].open(artifact.storage_key, "rb") as stored:
        assert stored.read() == BLOB


def test_an_upload_never_reads_the_whole_body_into_memory(api, creator, run, monkeypatch):
    from django.core.handlers.wsgi import WSGIRequest

    def refuse(self):
        raise AssertionError("request.body must not be used for artifact uploads")

    monkeypatch.setattr(WSGIRequest, "body", property(refuse))
    assert put(api(creator), run).status_code == 201


def test_the_same_content_again_is_idempotent_and_keeps_one_blob(api, creator, artifact, run, settings):
    response = put(api(creator), run)
    assert response.status_code == 200 and response.json()["sha256"] == SHA
    assert Artifact.objects.filter(run=run).count() == 1
    assert stored_files(settings) == [artifact.storage_key]


def test_different_content_at_a_stored_path_is_a_conflict_and_the_stored_file_is_untouched(
    api, creator, artifact, run, settings
):
    response = put(api(creator), run, data=b"something else")
    assert response.status_code == 409
    assert response.json()["error"] == "conflict" and response.json()["field"] == "path"
    assert stored_files(settings) == [artifact.storage_key]
    assert body(api(creator).get(url(run))) == BLOB


def test_a_declared_digest_that_does_not_match_keeps_nothing(api, creator, run, settings):
    response = put(api(creator), run, HTTP_X_MADO_SHA256="0" * 64)
    assert response.status_code == 400 and response.json()["field"] == "X-Mado-Sha256"
    assert not Artifact.objects.exists() and stored_files(settings) == []


def test_a_malformed_declared_digest_is_refused(api, creator, run, settings):
    response = put(api(creator), run, HTTP_X_MADO_SHA256="abc")
    assert response.status_code == 400 and response.json()["field"] == "X-Mado-Sha256"
    assert stored_files(settings) == []


class CutInput:
    """A WSGI input whose client went away after a few bytes."""

    def __init__(self, data):
        self.data = data

    def read(self, size=-1):
        size = len(self.data) if size is None or size < 0 else size
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk

    def readline(self, size=-1):
        return self.read(size)


def test_a_body_shorter_than_its_content_length_keeps_nothing(api, creator, run, settings):
    response = api(creator).generic(
        "PUT",
        url(run),
        data=b"only-part",
        content_type="application/octet-stream",
        CONTENT_LENGTH="100",
        **{"wsgi.input": CutInput(b"only-part")},
    )
    assert response.status_code == 400 and response.json()["field"] == "body"
    assert not Artifact.objects.exists() and stored_files(settings) == []


def test_a_chunked_upload_the_server_cannot_read_is_refused(api, creator, run, settings):
    response = api(creator).generic(
        "PUT", url(run), content_type="application/octet-stream", HTTP_TRANSFER_ENCODING="chunked"
    )
    assert response.status_code == 400 and response.json()["field"] == "Content-Length"
    assert stored_files(settings) == []


def test_a_chunked_upload_is_streamed_when_the_server_terminates_the_input(api, creator, run):
    extra = {"wsgi.input_terminated": True, "wsgi.input": CutInput(BLOB), "HTTP_TRANSFER_ENCODING": "chunked"}
    response = api(creator).generic("PUT", url(run), content_type="application/octet-stream", **extra)
    assert response.status_code == 201 and response.json()["sha256"] == SHA


def test_an_empty_file_is_a_valid_artifact(api, creator, run):
    response = put(api(creator), run, data=b"", path="empty.txt")
    assert response.status_code == 201 and response.json()["size"] == 0
    assert response.json()["sha256"] == hashlib.sha256(b"").hexdigest()
    assert body(api(creator).get(url(run, "empty.txt"))) == b""


@pytest.mark.parametrize(
    "path",
    [
        "a/../b",
        "../escape",
        "a/./b",
        "a//b",
        "dir/",
        "back\\slash",
        "nul\x00byte",
        "x" * 1025,
    ],
)
def test_an_unsafe_path_is_refused_naming_path(api, creator, run, settings, path):
    response = put(api(creator), run, path=path)
    assert response.status_code == 400 and response.json()["field"] == "path"
    assert stored_files(settings) == []


def test_an_absolute_path_is_refused(api, creator, run):
    response = put(api(creator), run, path="/etc/passwd")  # URL .../artifacts//etc/passwd
    assert response.status_code == 400 and response.json()["field"] == "path"


def test_a_long_nested_path_is_accepted(api, creator, run):
    path = "/".join(["d" * 99] * 10) + "/f.bin"  # 1006 characters
    assert put(api(creator), run, data=b"x", path=path).status_code == 201


# --- download ---------------------------------------------------------------------------


def test_a_download_carries_digest_size_and_accepts_ranges(api, viewer, artifact, run):
    response = api(viewer).get(url(run))
    assert response.status_code == 200 and response.streaming
    assert response["ETag"] == f'"{SHA}"' and response["X-Mado-Sha256"] == SHA
    assert response["Content-Length"] == str(len(BLOB)) and response["Accept-Ranges"] == "bytes"
    assert response["Content-Type"] == "application/octet-stream"
    assert 'filename="step-10.tar"' in response["Content-Disposition"]


@pytest.mark.parametrize(
    "header, first, last",
    [
        ("bytes=0-9", 0, 9),
        ("bytes=1048570-1048580", 1048570, 1048579),  # runs past the end: clamped
        ("bytes=1048000-", 1048000, len(BLOB) - 1),
        ("bytes=-4", len(BLOB) - 4, len(BLOB) - 1),
        ("bytes=-99999999", 0, len(BLOB) - 1),
    ],
)
def test_a_range_answers_206_with_exactly_those_bytes(api, viewer, artifact, run, header, first, last):
    response = api(viewer).get(url(run), HTTP_RANGE=header)
    assert response.status_code == 206
    assert body(response) == BLOB[first : last + 1]
    assert response["Content-Range"] == f"bytes {first}-{last}/{len(BLOB)}"
    assert response["Content-Length"] == str(last - first + 1)


@pytest.mark.parametrize("header", ["bytes=1048580-", f"bytes={len(BLOB)}-{len(BLOB) + 5}", "bytes=-0"])
def test_a_range_past_the_end_answers_416(api, viewer, artifact, run, header):
    response = api(viewer).get(url(run), HTTP_RANGE=header)
    assert response.status_code == 416
    assert response["Content-Range"] == f"bytes */{len(BLOB)}"
    assert response.json()["field"] == "Range"


def test_a_stored_file_cut_short_is_named_before_any_byte(api, viewer, artifact, run, settings):
    """A blob shorter than recorded answers 410 naming it, never a cut body (docs/design/checkpoints.md#damage)."""
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    with open(os.path.join(root, artifact.storage_key), "r+b") as stored:
        stored.truncate(len(BLOB) - 3000)
    response = api(viewer).get(url(run))
    assert response.status_code == 410 and response.json()["error"] == "artifact_damaged"
    assert f"the stored object is {len(BLOB) - 3000} bytes, {len(BLOB)} were verified" in response.json()["detail"]


def test_a_stored_file_cut_short_while_it_streams_breaks_the_download_instead_of_ending_it_early(
    api, viewer, artifact, run, settings
):
    """A blob that shrinks after the answer started must not end a body that declared the recorded length as if it
    were whole: the client would wait for the missing bytes until its read timeout. The stream raises after the last
    stored byte, so the server cuts the connection and the client retries or fails at once."""
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    response = api(viewer).get(url(run))
    assert response["Content-Length"] == str(len(BLOB))
    chunks = iter(response.streaming_content)
    received = next(chunks)
    with open(os.path.join(root, artifact.storage_key), "r+b") as stored:
        stored.truncate(len(BLOB) - 3)  # inside the second 1 MiB chunk, not yet read
    with pytest.raises(OSError, match="ended 3 bytes before"):
        for chunk in chunks:
            received += chunk
    assert received == BLOB[: len(BLOB) - 3]


@pytest.mark.parametrize("header", ["bytes=5-2", "items=0-1", "bytes=0-1,4-5", "garbage"])
def test_a_malformed_or_multi_range_is_ignored(api, viewer, artifact, run, header):
    response = api(viewer).get(url(run), HTTP_RANGE=header)
    assert response.status_code == 200 and body(response) == BLOB


def test_an_if_range_that_is_not_the_etag_sends_the_whole_file(api, viewer, artifact, run):
    stale = api(viewer).get(url(run), HTTP_RANGE="bytes=0-1", HTTP_IF_RANGE='"other"')
    fresh = api(viewer).get(url(run), HTTP_RANGE="bytes=0-1", HTTP_IF_RANGE=f'"{SHA}"')
    assert (stale.status_code, fresh.status_code) == (200, 206)


def test_a_download_that_asks_for_octet_stream_is_served(api, viewer, artifact, run):
    assert api(viewer).get(url(run), HTTP_ACCEPT="application/octet-stream").status_code == 200


def test_a_missing_artifact_and_another_projects_artifact_answer_404(api, creator, outsider, other_project, run):
    foreign = RunFactory(project=other_project, created_by=outsider)
    assert put(api(outsider), foreign).status_code == 201
    assert api(creator).get(url(foreign)).status_code == 404
    assert api(creator).get(url(run, "nothing.bin")).status_code == 404
    assert api(creator).put(url(foreign), data=b"x", content_type="application/octet-stream").status_code == 404


# --- delete ---------------------------------------------------------------------------------


def test_a_deleted_path_can_be_uploaded_again(api, admin, artifact, run, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert api(admin).delete(url(run)).status_code == 204
    assert put(api(admin), run, data=b"new").status_code == 201


def test_a_checkpoints_tar_cannot_be_deleted_as_a_plain_artifact(api, admin, artifact, run, settings):
    Checkpoint.objects.create(run=run, step=10, artifact=artifact)
    response = api(admin).delete(url(run))
    assert response.status_code == 409 and response.json()["field"] == "path"
    assert Artifact.objects.filter(pk=artifact.pk).exists() and stored_files(settings) == [artifact.storage_key]


def test_the_blob_is_removed_only_when_the_delete_commits(
    api, admin, artifact, run, settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert api(admin).delete(url(run)).status_code == 204
    assert stored_files(settings) == [artifact.storage_key]  # transaction not committed yet
    for callback in callbacks:
        callback()
    assert stored_files(settings) == []
