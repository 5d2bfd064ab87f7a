"""Restoring a checkpoint checks it while the bytes stream into the files (one pass, the tar never stored),
resumes a broken read with a ranged read, and names any difference from the manifest
(docs/design/worker.md#fetch, #verify, #refusal)."""

import os
import tarfile

import pytest

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointState, ManifestEntry
from tests.worker.helpers import FILES, make_tar, member, sha, store_blob, stored_checkpoint
from worker.errors import ArchiveRejected, CheckpointMismatch, StorageUnavailable
from worker.fetch import CHUNK_SIZE, fetch_artifact, restore_checkpoint

pytestmark = pytest.mark.django_db


def job_dir(tmp_path):
    path = tmp_path / "job"
    path.mkdir(exist_ok=True)
    return path


def fetch(checkpoint, tmp_path, **kwargs):
    return restore_checkpoint(checkpoint=checkpoint, workdir=job_dir(tmp_path), backoff_s=0, **kwargs)


def extracted(restored) -> dict[str, bytes]:
    root = restored.checkpoint_dir
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def refused(checkpoint, tmp_path) -> str:
    with pytest.raises(CheckpointMismatch) as caught:
        fetch(checkpoint, tmp_path)
    assert list(job_dir(tmp_path).iterdir()) == [], "a refused restore must leave nothing on disk"
    message = str(caught.value)
    assert message.startswith(f"Checkpoint {checkpoint.pk} {caught.value.what} mismatch: ")
    return message


def test_a_good_checkpoint_is_extracted_verified_and_written_once(run, tmp_path):
    checkpoint = stored_checkpoint(run, 10)
    restored = fetch(checkpoint, tmp_path)
    assert extracted(restored) == FILES
    assert restored.size == len(make_tar(FILES))
    assert restored.bytes_written == sum(len(data) for data in FILES.values())
    assert sorted(f.path for f in restored.manifest) == sorted(FILES)
    assert sorted(p.name for p in job_dir(tmp_path).iterdir()) == ["checkpoint"], "the tar is never stored"


TAMPERED = {
    "extra file": (make_tar({**FILES, "extra.txt": b"x"}), "manifest", "extra file 'extra.txt'"),
    "missing file": (
        make_tar({k: v for k, v in FILES.items() if k != "optim/state.pt"}),
        "manifest",
        "missing from the tar: 'optim/state.pt'",
    ),
    "size": (make_tar({**FILES, "model.pt": b"weights" * 999}), "size", "'model.pt' is 6993 bytes in the tar"),
    "sha256": (make_tar({**FILES, "model.pt": b"X" + (b"weights" * 1000)[1:]}), "sha256", "'model.pt' has SHA-256"),
    "dot-dot": (make_tar(FILES, extra=[member("../evil.sh", b"rm -rf ~")]), "path", "'../evil.sh'"),
    "nested dot-dot": (make_tar(FILES, extra=[member("optim/../../evil", b"x")]), "path", "optim/../../evil"),
    "absolute": (make_tar(FILES, extra=[member("/etc/cron.d/evil", b"x")]), "path", "'/etc/cron.d/evil'"),
    "symlink": (
        make_tar(FILES, extra=[member("link", kind=tarfile.SYMTYPE, linkname="/etc/passwd")]),
        "tar",
        "'link' is a symbolic link",
    ),
    "hardlink": (
        make_tar(FILES, extra=[member("hard", kind=tarfile.LNKTYPE, linkname="model.pt")]),
        "tar",
        "'hard' is a hard link",
    ),
    "contiguous": (make_tar(FILES, extra=[member("c", kind=tarfile.CONTTYPE)]), "tar", "'c' is a contiguous file"),
    "fifo": (make_tar(FILES, extra=[member("pipe", kind=tarfile.FIFOTYPE)]), "tar", "'pipe' is a FIFO"),
    "device": (make_tar(FILES, extra=[member("dev", kind=tarfile.CHRTYPE)]), "tar", "'dev' is a character device"),
}


@pytest.mark.parametrize("kind", list(TAMPERED))
def test_each_kind_of_tampering_is_named(run, tmp_path, kind):
    stored, what, detail = TAMPERED[kind]
    checkpoint = stored_checkpoint(run, 10, stored=stored)
    message = refused(checkpoint, tmp_path)
    assert message.startswith(f"Checkpoint {checkpoint.pk} {what} mismatch: "), message
    assert detail in message


def test_a_tar_that_differs_only_outside_the_files_is_a_tar_sha256_mismatch(run, tmp_path):
    good = make_tar(FILES)
    header_changed = bytearray(good)
    header_changed[100:108] = b"0000644\x00"  # a mode field: same files, another tar
    checksum = sum(header_changed[:148]) + 256 + sum(header_changed[156:512])
    header_changed[148:156] = f"{checksum:06o}\x00 ".encode()
    message = refused(stored_checkpoint(run, 10, stored=bytes(header_changed)), tmp_path)
    assert "sha256 mismatch: the stored tar's SHA-256 is" in message and sha(good) in message


def test_trailing_bytes_are_a_size_mismatch(run, tmp_path):
    message = refused(stored_checkpoint(run, 10, stored=make_tar(FILES) + b"\x00" * 512), tmp_path)
    assert "size mismatch: the stored tar is" in message


def test_a_much_longer_object_is_refused_before_it_is_read(run, tmp_path, monkeypatch):
    checkpoint = stored_checkpoint(run, 10, stored=make_tar(FILES) + b"\x00" * (2 * 1024 * 1024))
    monkeypatch.setattr(storage, "blob_open_range", lambda **kw: pytest.fail("the object was read"))
    assert "size mismatch: the stored tar is" in refused(checkpoint, tmp_path)


def test_a_truncated_object_is_refused(run, tmp_path):
    good = make_tar(FILES)
    message = refused(stored_checkpoint(run, 10, stored=good[:3000]), tmp_path)
    assert "tar mismatch: the archive is truncated after 3000 bytes" in message


def test_an_object_cut_in_its_end_padding_is_a_size_mismatch(run, tmp_path):
    good = make_tar(FILES)
    message = refused(stored_checkpoint(run, 10, stored=good[:-2000]), tmp_path)
    assert f"size mismatch: the stored tar is {len(good) - 2000} bytes, {len(good)} were recorded" in message


def test_a_missing_object_is_refused(run, tmp_path):
    checkpoint = stored_checkpoint(run, 10)
    storage.artifact_storage().delete(checkpoint.artifact.storage_key)
    message = refused(checkpoint, tmp_path)
    assert message == (
        f"Checkpoint {checkpoint.pk} artifact mismatch: object missing: "
        f"{checkpoint.artifact.storage_key} is not in the storage"
    )


def test_a_checkpoint_that_is_not_complete_is_refused(run, tmp_path):
    checkpoint = stored_checkpoint(run, 10, state=CheckpointState.PENDING)
    assert "artifact mismatch: the checkpoint is pending" in refused(checkpoint, tmp_path)


def test_a_manifest_that_lost_a_row_is_refused(run, tmp_path):
    checkpoint = stored_checkpoint(run, 10)
    ManifestEntry.objects.filter(checkpoint=checkpoint, path="empty.bin").delete()
    assert "manifest mismatch: extra file 'empty.bin'" in refused(checkpoint, tmp_path)


BIG = {"model.pt": os.urandom(3 * CHUNK_SIZE + 12345), "rng.bin": b"r" * 100}


def flaky_open_range(monkeypatch, *, break_after_chunks: int = 1, failures: int = 1, error=ConnectionResetError):
    """Make the first ``failures`` reads of the storage break after ``break_after_chunks`` chunks."""
    real = storage.blob_open_range
    starts: list[int] = []

    def open_range(*, key, start, length, chunk_size=CHUNK_SIZE):
        starts.append(start)
        inner = real(key=key, start=start, length=length, chunk_size=chunk_size)
        if len(starts) > failures:
            return inner

        def broken():
            try:
                for _ in range(break_after_chunks):
                    yield next(inner)
            finally:
                inner.close()
            raise error("connection reset by peer")

        return broken()

    monkeypatch.setattr(storage, "blob_open_range", open_range)
    return starts


def test_a_broken_read_resumes_with_a_ranged_read_from_the_byte_reached(run, tmp_path, monkeypatch):
    checkpoint = stored_checkpoint(run, 10, BIG)
    starts = flaky_open_range(monkeypatch, break_after_chunks=2)
    restored = fetch(checkpoint, tmp_path)
    assert starts == [0, 2 * CHUNK_SIZE]
    assert extracted(restored) == BIG


def test_a_body_that_ends_early_is_resumed_too(run, tmp_path, monkeypatch):
    checkpoint = stored_checkpoint(run, 10, BIG)
    real = storage.blob_open_range
    starts = []

    def short(*, key, start, length, chunk_size=CHUNK_SIZE):
        starts.append(start)
        return real(key=key, start=start, length=min(length, CHUNK_SIZE + 7), chunk_size=chunk_size)

    monkeypatch.setattr(storage, "blob_open_range", short)
    assert extracted(fetch(checkpoint, tmp_path)) == BIG
    assert starts[:3] == [0, CHUNK_SIZE + 7, 2 * (CHUNK_SIZE + 7)]


def test_a_storage_that_keeps_failing_gives_up_after_bounded_retries(run, tmp_path, monkeypatch):
    checkpoint = stored_checkpoint(run, 10, BIG)
    starts = flaky_open_range(monkeypatch, break_after_chunks=0, failures=100, error=ConnectionError)
    with pytest.raises(StorageUnavailable, match="failed 3 times at byte 0"):
        fetch(checkpoint, tmp_path, attempts=3)
    assert starts == [0, 0, 0]
    assert list(job_dir(tmp_path).iterdir()) == []


def test_progress_resets_the_failure_count(run, tmp_path, monkeypatch):
    """Each read breaks after one chunk: the download still completes, resuming once per chunk."""
    checkpoint = stored_checkpoint(run, 10, BIG)
    starts = flaky_open_range(monkeypatch, break_after_chunks=1, failures=3)
    fetch(checkpoint, tmp_path, attempts=2)
    assert starts == [0, CHUNK_SIZE, 2 * CHUNK_SIZE, 3 * CHUNK_SIZE]


def test_an_existing_destination_is_never_overwritten(run, tmp_path):
    mine = job_dir(tmp_path) / "checkpoint" / "mine"
    mine.parent.mkdir()
    mine.write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        fetch(stored_checkpoint(run, 10), tmp_path)
    assert mine.read_bytes() == b"mine"


def test_the_checkpoint_row_is_left_unchanged(run, tmp_path):
    checkpoint = stored_checkpoint(run, 10, stored=make_tar({**FILES, "extra": b"x"}))
    before = Checkpoint.objects.filter(pk=checkpoint.pk).values().get()
    refused(checkpoint, tmp_path)
    assert Checkpoint.objects.filter(pk=checkpoint.pk).values().get() == before


# --- plain artifacts (a Code version's archive) -------------------------------------------------


def code_artifact(project, data: bytes, *, recorded: bytes | None = None):
    from checkpoints.models import Artifact

    recorded = data if recorded is None else recorded
    return Artifact.objects.create(
        project=project,
        run=None,
        path="codes/1/code.tar.gz",
        size=len(recorded),
        sha256=sha(recorded),
        storage_key=store_blob(data, "codes/1"),
    )


def test_an_artifact_is_fetched_with_its_size_and_sha256_checked(project, tmp_path):
    artifact = code_artifact(project, b"code bytes" * 1000)
    fetch_artifact(artifact=artifact, dest=tmp_path / "code.tar.gz", label="Code version 1 archive", backoff_s=0)
    assert (tmp_path / "code.tar.gz").read_bytes() == b"code bytes" * 1000


@pytest.mark.parametrize(
    "stored, detail",
    [
        (b"code bytes" * 999, "size mismatch"),
        (b"code bytes" * 1001, "size mismatch"),
        (b"CODE BYTES" * 1000, "sha256 mismatch"),
    ],
)
def test_an_artifact_that_differs_is_rejected(project, tmp_path, stored, detail):
    artifact = code_artifact(project, stored, recorded=b"code bytes" * 1000)
    with pytest.raises(ArchiveRejected, match=f"Code version 1 archive {detail}"):
        fetch_artifact(artifact=artifact, dest=tmp_path / "a", label="Code version 1 archive", backoff_s=0)
    assert not (tmp_path / "a").exists()


def test_a_missing_artifact_is_rejected(project, tmp_path):
    artifact = code_artifact(project, b"x")
    storage.artifact_storage().delete(artifact.storage_key)
    with pytest.raises(ArchiveRejected, match="Code version 1 archive is missing from the storage"):
        fetch_artifact(artifact=artifact, dest=tmp_path / "a", label="Code version 1 archive", backoff_s=0)
