"""Artifact storage and services: streaming, races, cleanup (docs/design/checkpoints.md#deletion;
docs/design/worker.md#fetch)."""

import hashlib
import io
import os

import pytest

from checkpoints import selectors, services, storage
from checkpoints.api import RangeNotSatisfiable, parse_range
from checkpoints.models import Artifact
from mado.errors import Conflict, Forbidden, ValidationFailed
from runs.models import CodeVersion
from tests.factories import CodeFactory


def stored_files(settings):
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


class TrickleSource:
    """A source that hands out at most 1000 bytes per read (like a slow socket) and records read sizes."""

    def __init__(self, data: bytes):
        self.data, self.reads = data, []

    def read(self, size=-1):
        self.reads.append(size)
        size = min(1000, len(self.data) if size < 0 else size)
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


def test_the_hashing_reader_fills_each_read_and_never_asks_for_more_than_a_chunk():
    source = TrickleSource(b"a" * 5000)
    reader = storage.HashingReader(source)
    assert len(reader.read(4096)) == 4096 and len(reader.read(4096)) == 904 and reader.read(10) == b""
    assert reader.size == 5000 and reader.sha256 == hashlib.sha256(b"a" * 5000).hexdigest()
    assert max(source.reads) <= storage.CHUNK_SIZE


def test_a_blob_write_streams_in_chunks_of_at_most_one_mebibyte():
    data = os.urandom(3 * storage.CHUNK_SIZE + 11)
    source = TrickleSource(data)
    source_read = source.read
    source.read = lambda size=-1: source_read(size) if size <= storage.CHUNK_SIZE else pytest.fail(f"read({size})")
    blob = storage.blob_write(source=source, prefix="runs/7")
    assert blob.size == len(data) and blob.sha256 == hashlib.sha256(data).hexdigest()
    assert blob.key.startswith("runs/7/") and len(blob.key) == len("runs/7/") + 32
    assert b"".join(storage.blob_open_range(key=blob.key, start=0, length=blob.size)) == data


def test_a_failing_source_leaves_no_partial_blob(settings):
    class Broken:
        def __init__(self):
            self.calls = 0

        def read(self, size=-1):
            self.calls += 1
            if self.calls > 2:
                raise ConnectionResetError("client went away")
            return b"x" * size

    with pytest.raises(ConnectionResetError):
        storage.blob_write(source=Broken(), prefix="runs/1")
    assert stored_files(settings) == []


def test_ranged_reads_come_in_chunks_and_stop_at_the_length():
    data = bytes(range(256)) * 100
    blob = storage.blob_write(source=io.BytesIO(data), prefix="runs/1")
    chunks = list(storage.blob_open_range(key=blob.key, start=10, length=1000, chunk_size=300))
    assert [len(c) for c in chunks] == [300, 300, 300, 100] and b"".join(chunks) == data[10:1010]


@pytest.mark.parametrize(
    "header, expected",
    [
        (None, None),
        ("bytes=0-0", (0, 0)),
        ("bytes=5-", (5, 9)),
        ("bytes=-3", (7, 9)),
        ("bytes=8-100", (8, 9)),
        ("bytes=-100", (0, 9)),
        ("bytes=4-2", None),
        ("bytes=1-2,5-6", None),
        ("bytes=-", None),
        ("chars=1-2", None),
    ],
)
def test_parse_range_follows_rfc_9110(header, expected):
    assert parse_range(header, 10) == expected


@pytest.mark.parametrize(
    "header, size", [("bytes=10-", 10), ("bytes=10-12", 10), ("bytes=-0", 10), ("bytes=-5", 0), ("bytes=0-", 0)]
)
def test_parse_range_refuses_ranges_that_select_no_byte(header, size):
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, size)


@pytest.mark.parametrize(
    "path", ["ok.txt", "a/b/c.tar", "checkpoints/step-10.tar", "dots.in.name", "..hidden", "a/...", "日本語/ファイル"]
)
def test_safe_paths_are_accepted(path):
    assert services.validate_artifact_path(path) == path


@pytest.mark.parametrize(
    "path", ["", "/abs", "a/../b", "..", ".", "a/./b", "a//b", "a/", "a\\b", "a\x00b", "a\nb", "a\x7fb", "x" * 1025]
)
def test_unsafe_paths_are_refused_naming_path(path):
    with pytest.raises(ValidationFailed) as caught:
        services.validate_artifact_path(path)
    assert caught.value.field == "path"


def test_a_viewer_cannot_store_and_nothing_is_read_or_kept(run, viewer, settings):
    source = TrickleSource(b"data")
    with pytest.raises(Forbidden):
        services.artifact_store(actor=viewer, run=run, path="a.bin", source=source)
    assert source.reads == [] and stored_files(settings) == []


@pytest.mark.parametrize("winner_content, outcome", [(b"same", "same"), (b"other", "conflict")])
def test_a_concurrent_upload_of_the_same_path_is_decided_by_the_unique_constraint(
    run, creator, settings, monkeypatch, winner_content, outcome
):
    """The other upload commits its row between our existence check and our insert."""
    real_write = storage.blob_write

    def write_then_lose_the_race(*, source, prefix):
        blob = real_write(source=source, prefix=prefix)
        winner = real_write(source=io.BytesIO(winner_content), prefix=prefix)
        Artifact.objects.create(
            project=run.project, run=run, path="p.bin", size=winner.size, sha256=winner.sha256, storage_key=winner.key
        )
        return blob

    monkeypatch.setattr(storage, "blob_write", write_then_lose_the_race)
    if outcome == "same":
        artifact, created = services.artifact_store(actor=creator, run=run, path="p.bin", source=io.BytesIO(b"same"))
        assert not created and artifact.sha256 == hashlib.sha256(b"same").hexdigest()
    else:
        with pytest.raises(Conflict):
            services.artifact_store(actor=creator, run=run, path="p.bin", source=io.BytesIO(b"same"))
    winner = Artifact.objects.get(run=run, path="p.bin")
    assert stored_files(settings) == [winner.storage_key]  # our blob was dropped, the winner's kept


def test_a_retry_of_a_stored_path_is_only_hashed_never_written(run, creator, settings, monkeypatch):
    services.artifact_store(actor=creator, run=run, path="p.bin", source=io.BytesIO(b"payload"))
    monkeypatch.setattr(storage, "blob_write", lambda **kw: pytest.fail("a stored path must not be written again"))
    artifact, created = services.artifact_store(actor=creator, run=run, path="p.bin", source=io.BytesIO(b"payload"))
    assert not created and len(stored_files(settings)) == 1


def test_a_retry_with_a_wrong_declared_digest_is_refused(run, creator):
    services.artifact_store(actor=creator, run=run, path="p.bin", source=io.BytesIO(b"payload"))
    with pytest.raises(ValidationFailed) as caught:
        services.artifact_store(
            actor=creator, run=run, path="p.bin", source=io.BytesIO(b"payload"), expected_sha256="1" * 64
        )
    assert caught.value.field == "X-Mado-Sha256"


def test_a_refused_code_version_keeps_no_archive_bytes(project, creator, settings):
    code = CodeFactory(project=project, created_by=creator)
    with pytest.raises(ValidationFailed) as caught:
        services.code_version_create_with_archive(actor=creator, code=code, entrypoint=[], archive=io.BytesIO(b"tar"))
    assert caught.value.field == "entrypoint"
    assert not Artifact.objects.exists() and not CodeVersion.objects.exists() and stored_files(settings) == []


def test_a_viewer_cannot_add_a_code_version_and_no_byte_is_stored(project, creator, viewer, settings):
    code = CodeFactory(project=project, created_by=creator)
    with pytest.raises(Forbidden):
        services.code_version_create_with_archive(
            actor=viewer, code=code, entrypoint=["python"], archive=io.BytesIO(b"t")
        )
    assert stored_files(settings) == []


@pytest.mark.parametrize("name, stored_as", [("..\\..\\evil.tar", "evil.tar"), ("../..", "archive"), ("", "archive")])
def test_a_code_archive_keeps_only_a_safe_base_name(project, creator, name, stored_as):
    code = CodeFactory(project=project, created_by=creator)
    version = services.code_version_create_with_archive(
        actor=creator, code=code, entrypoint=["python"], archive=io.BytesIO(b"t"), archive_name=name
    )
    assert version.archive.path == f"codes/{code.pk}/{stored_as}"


def test_artifact_lookup_is_scoped_to_the_users_projects(run, creator, outsider):
    services.artifact_store(actor=creator, run=run, path="p.bin", source=io.BytesIO(b"x"))
    assert selectors.artifact_get_for_user(user=creator, run_id=run.pk, path="p.bin").path == "p.bin"
    with pytest.raises(Exception) as caught:
        selectors.artifact_get_for_user(user=outsider, run_id=run.pk, path="p.bin")
    assert caught.value.status == 404
