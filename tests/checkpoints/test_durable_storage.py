"""The file-system artifact storage writes every blob to disk before the save returns
(docs/design/checkpoints.md#a-checkpoint, #save-and-restore)."""

import errno
import os

import pytest
from django.core.files.uploadedfile import TemporaryUploadedFile

from checkpoints import filesystem
from checkpoints.filesystem import DurableFileSystemStorage
from mado_tracking import writeback
from tests.checkpoints.checkpoint_helpers import FillsUp


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
    """The paths ``os.fsync`` was called on, in order."""
    calls = []
    real = os.fsync

    def recording(fd):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return calls


def test_a_blob_is_synced_with_its_directory_and_the_directories_it_created(tmp_path, synced):
    storage = DurableFileSystemStorage(location=tmp_path)
    name = storage.save("runs/7/blob", Chunks([b"a" * 3000, b"b" * 3000]))
    assert (tmp_path / name).read_bytes() == b"a" * 3000 + b"b" * 3000
    assert synced == [str(tmp_path / name), str(tmp_path / "runs" / "7"), str(tmp_path / "runs"), str(tmp_path)]
    storage.save("runs/7/other", Chunks([b"c"]))
    assert synced[4:] == [str(tmp_path / "runs" / "7" / "other"), str(tmp_path / "runs" / "7")]


@pytest.mark.skipif(not writeback.AVAILABLE, reason="sync_file_range is Linux's")
def test_a_long_stream_is_dropped_from_the_page_cache_window_by_window(tmp_path, dropped_windows):
    dropped = dropped_windows
    pieces = [bytes([index]) * 3000 for index in range(20)]  # 60,000 bytes: windows of 6,000
    name = DurableFileSystemStorage(location=tmp_path).save("runs/7/blob", Chunks(pieces))
    assert (tmp_path / name).read_bytes() == b"".join(pieces)
    windows, last = dropped[:-1], dropped[-1]
    assert windows[0][0] == 0 and all(length > 0 for _, length in windows)
    assert all(a + la == b for (a, la), (b, _) in zip(windows, windows[1:]))  # contiguous, in order
    assert last == (windows[-1][0] + windows[-1][1], 0)  # the rest, after the fsync


def test_a_stream_that_breaks_off_leaves_no_file(tmp_path):
    storage = DurableFileSystemStorage(location=tmp_path)
    with pytest.raises(OSError, match="went away"):
        storage.save("runs/7/blob", Chunks([b"a" * 5000, b"b" * 5000], fail_after=1))
    assert list((tmp_path / "runs" / "7").iterdir()) == []


def test_a_full_volume_raises_enospc_and_leaves_no_file(tmp_path, monkeypatch):
    real_open = open
    monkeypatch.setattr(filesystem, "open", lambda *args, **kw: FillsUp(real_open(*args, **kw), 7000), raising=False)
    with pytest.raises(OSError) as raised:
        DurableFileSystemStorage(location=tmp_path).save("runs/7/blob", Chunks([b"a" * 5000, b"b" * 5000]))
    assert raised.value.errno == errno.ENOSPC
    assert list((tmp_path / "runs" / "7").iterdir()) == []


def test_a_taken_name_is_never_overwritten(tmp_path):
    storage = DurableFileSystemStorage(location=tmp_path, file_permissions_mode=0o640, directory_permissions_mode=0o750)
    first = storage.save("runs/7/blob", Chunks([b"first"]))
    second = storage.save("runs/7/blob", Chunks([b"second"]))
    assert first != second
    assert (tmp_path / first).read_bytes() == b"first" and (tmp_path / second).read_bytes() == b"second"
    assert (tmp_path / second).stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "runs" / "7").stat().st_mode & 0o777 == 0o750


def test_a_file_django_moves_into_place_is_synced_too(tmp_path, synced):
    storage = DurableFileSystemStorage(location=tmp_path)
    upload = TemporaryUploadedFile("readme.txt", "text/plain", 5, None)
    upload.write(b"hello")
    upload.flush()
    name = storage.save("notes/readme.txt", upload)
    upload.close()  # moved away: Django's closer knows the file is gone
    assert (tmp_path / name).read_bytes() == b"hello"
    assert synced == [str(tmp_path / name), str(tmp_path / "notes"), str(tmp_path)]
