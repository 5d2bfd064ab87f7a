"""The file-system artifact storage writes every blob to disk before the save returns (SPEC F1, F33)."""

import os

import pytest
from django.core.files.uploadedfile import TemporaryUploadedFile

from checkpoints import filesystem
from checkpoints.filesystem import DurableFileSystemStorage


class Chunks:
    """Content streamed in ``pieces``; ``fail_after`` pieces raise ``OSError`` (a client that broke off)."""

    def __init__(self, pieces: list[bytes], fail_after: int | None = None):
        self.pieces, self.fail_after = pieces, fail_after

    def chunks(self):
        for index, piece in enumerate(self.pieces):
            if index == self.fail_after:
                raise OSError("the client went away")
            yield piece


@pytest.fixture
def synced(monkeypatch):
    """The paths ``os.fsync`` was called on, in order (the directory's after the file's)."""
    calls = []
    real = os.fsync

    def recording(fd):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return calls


def test_a_streamed_blob_is_whole_and_synced_with_its_directory_before_the_save_returns(tmp_path, synced,
                                                                                         monkeypatch):
    monkeypatch.setattr(filesystem, "FLUSH_AFTER", 4096)  # many writeback windows in a small blob
    pieces = [bytes([index]) * 3000 for index in range(20)]
    storage = DurableFileSystemStorage(location=tmp_path)
    name = storage.save("runs/7/blob", Chunks(pieces))
    assert (tmp_path / name).read_bytes() == b"".join(pieces)
    assert synced == [str(tmp_path / name), str(tmp_path / "runs" / "7")]


def test_a_stream_that_breaks_off_leaves_no_file(tmp_path):
    storage = DurableFileSystemStorage(location=tmp_path)
    with pytest.raises(OSError, match="went away"):
        storage.save("runs/7/blob", Chunks([b"a" * 5000, b"b" * 5000], fail_after=1))
    assert list((tmp_path / "runs" / "7").iterdir()) == []


def test_a_taken_name_is_never_overwritten(tmp_path):
    storage = DurableFileSystemStorage(location=tmp_path, file_permissions_mode=0o640)
    first = storage.save("runs/7/blob", Chunks([b"first"]))
    second = storage.save("runs/7/blob", Chunks([b"second"]))
    assert first != second
    assert (tmp_path / first).read_bytes() == b"first" and (tmp_path / second).read_bytes() == b"second"
    assert (tmp_path / second).stat().st_mode & 0o777 == 0o640


def test_a_file_django_moves_into_place_is_synced_too(tmp_path, synced):
    storage = DurableFileSystemStorage(location=tmp_path)
    upload = TemporaryUploadedFile("readme.txt", "text/plain", 5, None)
    upload.write(b"hello")
    upload.flush()
    name = storage.save("notes/readme.txt", upload)
    upload.close()  # moved away: Django's closer knows the file is gone
    assert (tmp_path / name).read_bytes() == b"hello"
    assert synced[-2:] == [str(tmp_path / name), str(tmp_path / "notes")]
