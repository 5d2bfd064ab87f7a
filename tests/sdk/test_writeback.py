"""Big snapshot copies and stored blobs do not pile up in the page cache (mado_tracking.writeback;
docs/design/checkpoints.md#a-checkpoint, #save-and-restore)."""

import errno
import os

import pytest

from mado_tracking import writeback
from mado_tracking.writeback import copy_windowed

pytestmark = pytest.mark.skipif(
    not writeback.AVAILABLE or not hasattr(os, "copy_file_range"),
    reason="sync_file_range and copy_file_range are Linux's",
)


def test_a_copy_is_exact_and_leaves_the_cache_window_by_window(tmp_path, dropped_windows):
    source = tmp_path / "model.pt"
    source.write_bytes(os.urandom(50_000))
    (tmp_path / "snapshot.pt").write_bytes(b"left by a failed clone attempt, longer than nothing")
    assert copy_windowed(source, tmp_path / "snapshot.pt")
    assert (tmp_path / "snapshot.pt").read_bytes() == source.read_bytes()
    assert len(dropped_windows) >= 10 and dropped_windows[0][0] == 0
    assert all(a + la == b for (a, la), (b, _) in zip(dropped_windows, dropped_windows[1:]))  # contiguous, in order


def test_an_empty_file_is_copied(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert copy_windowed(tmp_path / "empty", tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b""


def test_a_file_system_that_cannot_copy_ranges_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    def refuses(*args):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuses)
    (tmp_path / "model.pt").write_bytes(b"x" * 10_000)
    assert copy_windowed(tmp_path / "model.pt", tmp_path / "snapshot.pt") is False
    assert not (tmp_path / "snapshot.pt").exists()


def test_a_disk_that_fills_up_mid_copy_raises_and_leaves_no_partial_file(tmp_path, monkeypatch, dropped_windows):
    real, calls = os.copy_file_range, []

    def fills_up(reader, writer, count, *args):
        calls.append(count)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(reader, writer, count, *args)

    monkeypatch.setattr(os, "copy_file_range", fills_up)
    (tmp_path / "model.pt").write_bytes(os.urandom(50_000))
    with pytest.raises(OSError) as raised:
        copy_windowed(tmp_path / "model.pt", tmp_path / "snapshot.pt")
    assert raised.value.errno == errno.ENOSPC
    assert not (tmp_path / "snapshot.pt").exists()
