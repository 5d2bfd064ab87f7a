"""The SDK's checkpoint tar: refusals before any byte, and a tar the server's verifier accepts."""

import hashlib
import os

import pytest

from mado_tracking.tarstream import CheckpointError, CheckpointTar
from mado_tracking.tarverify import CheckpointVerifier, ManifestFile


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path / "ckpt"
    (root / "optim").mkdir(parents=True)
    (root / "model.pt").write_bytes(os.urandom(3 << 20) + b"tail")
    (root / "optim" / "state.pt").write_bytes(b"s" * 700)
    (root / "empty.bin").write_bytes(b"")
    return root


def test_the_stream_is_a_tar_matching_its_manifest(ckpt):
    tar = CheckpointTar(ckpt, chunk_size=1 << 16, tar_hash=True)
    blob = b"".join(tar)
    assert len(blob) == len(tar)
    assert tar.sha256 == hashlib.sha256(blob).hexdigest()
    assert [m["path"] for m in tar.manifest] == ["empty.bin", "model.pt", "optim/state.pt"]
    assert tar.manifest[1]["sha256"] == hashlib.sha256((ckpt / "model.pt").read_bytes()).hexdigest()
    verifier = CheckpointVerifier([ManifestFile(**m) for m in tar.manifest], tar_size=len(tar), tar_sha256=tar.sha256)
    verifier.feed(blob)
    verifier.finish()


def test_an_upload_stream_hashes_each_byte_once_and_leaves_the_tar_digest_to_the_server(ckpt):
    tar = CheckpointTar(ckpt)
    blob = b"".join(tar)
    assert tar.sha256 is None
    verifier = CheckpointVerifier([ManifestFile(**m) for m in tar.manifest], tar_size=len(tar))
    verifier.feed(blob)
    verifier.finish()
    assert verifier.sha256 == hashlib.sha256(blob).hexdigest()


def test_the_same_directory_gives_the_same_bytes(ckpt):
    first, second = CheckpointTar(ckpt, tar_hash=True), CheckpointTar(ckpt, tar_hash=True)
    b"".join(first), b"".join(second)
    assert first.sha256 == second.sha256


def test_a_symbolic_link_is_refused_naming_it(ckpt):
    (ckpt / "optim" / "link").symlink_to(ckpt / "model.pt")
    with pytest.raises(CheckpointError, match="optim/link: is a symbolic link"):
        CheckpointTar(ckpt)


def test_an_empty_subdirectory_is_refused_naming_it(ckpt):
    (ckpt / "logs").mkdir()
    with pytest.raises(CheckpointError, match="logs: empty directory"):
        CheckpointTar(ckpt)


def test_an_empty_root_is_refused(tmp_path):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(CheckpointError, match="empty directory"):
        CheckpointTar(tmp_path / "nothing")


def test_a_fifo_is_refused(ckpt):
    os.mkfifo(ckpt / "pipe")
    with pytest.raises(CheckpointError, match="pipe: is not a regular file"):
        CheckpointTar(ckpt)


@pytest.mark.parametrize("name", ["nul.txt", "CON", "model.", "run "])
def test_a_name_windows_cannot_create_is_refused_before_any_byte(ckpt, name):
    (ckpt / "optim" / name).write_bytes(b"x")
    with pytest.raises(CheckpointError, match=f"optim/{name}: cannot be in a checkpoint"):
        CheckpointTar(ckpt)


def test_a_path_longer_than_the_limit_is_refused_before_any_byte(ckpt, monkeypatch):
    monkeypatch.setenv("MADO_TAR_MAX_PATH_BYTES", "10")
    with pytest.raises(CheckpointError, match="optim/state.pt: cannot be in a checkpoint: .*longer than 10 bytes"):
        CheckpointTar(ckpt)
