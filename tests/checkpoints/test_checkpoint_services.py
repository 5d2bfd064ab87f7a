"""Checkpoint services below the API: streaming in 1 MiB chunks, the verification task, resumed reads."""

import io
import os

import pytest

from checkpoints import services, storage
from checkpoints.models import Checkpoint, CheckpointState
from mado.errors import Conflict, ValidationFailed
from tests.checkpoints.checkpoint_helpers import declaration, make_tar, manifest_of, sha
from worker import tasks

FILES = {"model.pt": os.urandom(3 * storage.CHUNK_SIZE + 5), "b.txt": b"hello"}
TAR = make_tar(FILES)


def stored_files(settings):
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


class Socket:
    """Hands out at most 300 KB per read, like a socket, and refuses reads larger than 1 MiB."""

    def __init__(self, data: bytes):
        self.data, self.reads = data, []

    def read(self, size=-1):
        assert 0 < size <= storage.CHUNK_SIZE, f"read({size})"
        self.reads.append(size)
        chunk, self.data = self.data[: min(size, 300_000)], self.data[min(size, 300_000) :]
        return chunk


@pytest.fixture
def pending(run, creator):
    return services.checkpoint_register(actor=creator, run=run, step=10, idempotency_key="k")[0]


def test_the_upload_streams_in_chunks_of_at_most_one_mebibyte(pending, creator):
    source = Socket(TAR)
    received = services.checkpoint_upload(actor=creator, checkpoint=pending, source=source, expected_size=len(TAR))
    assert received == {"received_bytes": len(TAR), "sha256": sha(TAR)}
    row = Checkpoint.objects.get(pk=pending.pk)
    assert sorted(m["path"] for m in row.received["members"]) == ["b.txt", "model.pt"]
    assert max(source.reads) == storage.CHUNK_SIZE


def test_register_returns_the_same_row_for_a_replayed_key_and_refuses_a_taken_step(run, creator, pending):
    assert services.checkpoint_register(actor=creator, run=run, step=10, idempotency_key="k") == (pending, False)
    with pytest.raises(Conflict, match="step 10 is already saved in this run"):
        services.checkpoint_register(actor=creator, run=run, step=10, idempotency_key="other")


def test_a_step_whose_tar_path_is_already_an_artifact_is_refused_and_nothing_is_registered(run, creator):
    services.artifact_store(actor=creator, run=run, path="checkpoints/step-3.tar", source=io.BytesIO(b"x"))
    with pytest.raises(Conflict, match="already a file"):
        services.checkpoint_register(actor=creator, run=run, step=3)
    assert not Checkpoint.objects.exists()


# --- the S3 verification path, run on whatever storage is configured -------------------------------


def uploaded_directly(checkpoint: Checkpoint, tar: bytes, files=FILES, **changes) -> Checkpoint:
    """Put ``tar`` in the storage as if the client had PUT its parts to S3 and called complete."""
    key, _ = storage.blob_write_through(
        source=io.BytesIO(tar), prefix=f"runs/{checkpoint.run_id}", on_chunk=lambda c: None
    )
    declared = {**declaration(tar, files), **changes}
    declared["manifest"] = sorted(declared["manifest"], key=lambda e: e["path"])
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        received={"storage_key": key, "upload_id": "u", "part_size": 8 << 20, "tar_size": len(tar), "uploaded": True},
        declared=declared,
    )
    return Checkpoint.objects.get(pk=checkpoint.pk)


def test_the_verification_task_completes_a_matching_upload(pending, settings):
    uploaded_directly(pending, TAR)
    assert tasks.checkpoint_verify.apply(args=[pending.pk]).get() == "complete"
    row = Checkpoint.objects.get(pk=pending.pk)
    assert row.state == CheckpointState.COMPLETE and row.tar_sha256 == sha(TAR) and row.file_count == 2
    assert row.artifact.storage_key in stored_files(settings) and row.declared is None
    assert tasks.checkpoint_verify.apply(args=[pending.pk]).get() == "skipped"  # redelivered: nothing to do


@pytest.mark.parametrize(
    "change, what",
    [
        ({"tar_sha256": "0" * 64}, "sha256"),
        ({"tar_size": len(TAR) - 1}, "size"),
        ({"manifest": manifest_of({"model.pt": FILES["model.pt"]})}, "manifest"),
        ({"manifest": manifest_of({**FILES, "b.txt": b"HELLO"})}, "sha256"),
    ],
)
def test_the_verification_task_records_a_mismatch_and_removes_the_object(
    pending, settings, django_capture_on_commit_callbacks, change, what
):
    uploaded_directly(pending, TAR, **change)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.checkpoint_verify_upload(checkpoint_id=pending.pk) == "mismatch"
    row = Checkpoint.objects.get(pk=pending.pk)
    assert row.state == CheckpointState.PENDING and row.error.startswith(f"Checkpoint {pending.pk} {what} mismatch: ")
    assert stored_files(settings) == [] and row.received == {}


def test_an_unreadable_storage_is_retried_then_recorded(pending, monkeypatch):
    uploaded_directly(pending, TAR)
    calls = []

    def broken(key):
        calls.append(key)
        raise OSError("storage unreachable")

    monkeypatch.setattr(storage, "blob_size", broken)
    result = tasks.checkpoint_verify.apply(args=[pending.pk])
    assert result.failed() and len(calls) == tasks.VERIFY_MAX_RETRIES + 1
    row = Checkpoint.objects.get(pk=pending.pk)
    assert row.state == CheckpointState.PENDING and "storage unreachable" in row.error


def test_a_broken_read_resumes_where_it_stopped(monkeypatch):
    key, _ = storage.blob_write_through(source=io.BytesIO(TAR), prefix="runs/1", on_chunk=lambda c: None)
    real, starts = storage.blob_open_range, []

    def flaky(*, key, start, length, chunk_size=storage.CHUNK_SIZE):
        starts.append(start)
        chunks = real(key=key, start=start, length=length, chunk_size=chunk_size)

        def gen():
            for index, chunk in enumerate(chunks):
                if len(starts) < 3 and index == 1:
                    raise ConnectionResetError("reset")
                yield chunk

        return gen()

    monkeypatch.setattr(storage, "blob_open_range", flaky)
    data = b"".join(storage.blob_iter_resuming(key=key, size=len(TAR)))
    assert data == TAR and starts == [0, storage.CHUNK_SIZE, 2 * storage.CHUNK_SIZE]


def test_completing_a_direct_upload_needs_its_upload_id(pending, creator):
    uploaded_directly(pending, TAR)
    with pytest.raises(ValidationFailed) as refused:
        services.checkpoint_complete(
            actor=creator,
            checkpoint=pending,
            upload_id="other",
            parts=[{"part_number": 1, "etag": "x"}],
            **declaration(TAR, FILES),
        )
    assert refused.value.field == "upload_id"
