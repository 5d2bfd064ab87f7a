"""Checkpoints hashed on several threads give the verdicts and digests of one thread
(docs/design/checkpoints.md#hash-threads): the tar writer's manifest, the verifier's members and tar digest, the
first difference named, and nothing left behind by a refused restore."""

import hashlib
import os
import tarfile

import pytest

from mado_tracking.errors import CheckpointError
from mado_tracking.extract import extract_checkpoint_stream
from mado_tracking.hashing import available_cores, hash_threads
from mado_tracking.tarstream import CheckpointTar
from mado_tracking.tarverify import CheckpointVerifier, ManifestFile, ManifestMismatch

SIZES = {"a.bin": 3 << 20, "b/c.bin": (1 << 20) + 7, "small.json": 100, "z.bin": 2 << 20}  # bytes


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    content = {}
    for name, size in SIZES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        content[name] = os.urandom(size)
        (root / name).write_bytes(content[name])
    return root, content


def tar_bytes(directory) -> tuple[bytes, list[dict]]:
    tar = CheckpointTar(directory)
    data = b"".join(tar)
    return data, tar.manifest


def verify(data: bytes, manifest: list[ManifestFile], threads: int, **declared) -> CheckpointVerifier:
    verifier = CheckpointVerifier(manifest, threads=threads, **declared)
    try:
        for start in range(0, len(data), 1 << 20):
            verifier.feed(data[start : start + (1 << 20)])
        verifier.finish()
    finally:
        verifier.close()
    return verifier


def test_hash_threads_default_to_the_cores_up_to_four_and_follow_the_variable():
    assert hash_threads({}) == min(available_cores(), 4)
    assert hash_threads({"MADO_HASH_THREADS": "7"}) == 7
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match="MADO_HASH_THREADS"):
            hash_threads({"MADO_HASH_THREADS": bad})


@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_the_tar_writer_lists_every_file_with_its_sha256_on_any_number_of_threads(files, monkeypatch, threads):
    root, content = files
    monkeypatch.setenv("MADO_HASH_THREADS", threads)
    _, manifest = tar_bytes(root)
    assert manifest == [
        {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in sorted(content.items())
    ]


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_the_verifier_finds_the_same_files_and_tar_digest_on_any_number_of_threads(files, threads):
    data, manifest = tar_bytes(files[0])
    entries = [ManifestFile(**entry) for entry in manifest]
    verifier = verify(data, entries, threads, tar_size=len(data), tar_sha256=hashlib.sha256(data).hexdigest())
    assert verifier.sha256 == hashlib.sha256(data).hexdigest()
    assert list(verifier.members.values()) == entries


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_an_earlier_file_that_differs_is_named_before_a_later_member_the_format_refuses(files, threads):
    data, manifest = tar_bytes(files[0])
    entries = [ManifestFile(**entry) for entry in manifest]
    flipped = bytearray(data)
    flipped[512 + 10] ^= 1  # a byte of the first file, a.bin
    link = tarfile.TarInfo("zz-link")
    link.type, link.linkname = tarfile.SYMTYPE, "a.bin"
    linked = bytes(flipped[:-1024]) + link.tobuf(format=tarfile.PAX_FORMAT) + bytes(1024)
    with pytest.raises(ManifestMismatch) as refused:
        verify(linked, entries, threads)
    assert refused.value.what == "sha256" and "'a.bin'" in refused.value.detail


@pytest.mark.parametrize("threads", [1, 3])
def test_a_restore_that_finds_a_changed_byte_in_its_last_file_leaves_nothing_behind(files, tmp_path, threads):
    data, manifest = tar_bytes(files[0])
    flipped = bytearray(data)
    flipped[-1024 - 600] ^= 1  # inside z.bin, the last file
    target = tmp_path / "checkpoint"
    with pytest.raises(CheckpointError, match="sha256 mismatch: 'z.bin'"):
        extract_checkpoint_stream(
            (bytes(flipped[start : start + (1 << 20)]) for start in range(0, len(flipped), 1 << 20)),
            target,
            checkpoint_id=1,
            manifest=manifest,
            tar_size=len(data),
            tar_sha256=hashlib.sha256(data).hexdigest(),
            threads=threads,
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("threads", [1, 3])
def test_a_restore_on_several_threads_writes_every_file_read_only(files, tmp_path, threads):
    root, content = files
    data, manifest = tar_bytes(root)
    chunks = (data[start : start + 300_000] for start in range(0, len(data), 300_000))
    target = extract_checkpoint_stream(
        chunks,
        tmp_path / "checkpoint",
        checkpoint_id=1,
        manifest=manifest,
        tar_size=len(data),
        tar_sha256=hashlib.sha256(data).hexdigest(),
        threads=threads,
    )
    for name, expected in content.items():
        assert (target / name).read_bytes() == expected
        assert (target / name).stat().st_mode & 0o777 == 0o444
