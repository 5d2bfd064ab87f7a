"""The streaming tar-vs-manifest check refuses every difference SPEC F13 lists."""

import hashlib
import io
import tarfile

import pytest

from checkpoints.tarverify import ManifestFile, ManifestMismatch, TarVerifier


def make_tar(files: dict[str, bytes], *, extra=None, fmt=tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return buffer.getvalue()


def manifest_of(files: dict[str, bytes]) -> list[ManifestFile]:
    return [ManifestFile(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]


def verify(blob: bytes, manifest, chunk: int = 1000, **declared) -> TarVerifier:
    verifier = TarVerifier(manifest, **declared)
    for start in range(0, len(blob), chunk):
        verifier.feed(blob[start : start + chunk])
    verifier.finish()
    return verifier


FILES = {"model.pt": b"w" * 3000, "optim/state.pt": b"", "deep/" + "x" * 150 + "/rng.bin": b"r" * 513}


@pytest.mark.parametrize("chunk", [1, 511, 512, 4096, 1 << 20])
@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_a_matching_tar_passes_whatever_the_chunking(chunk, fmt):
    blob = make_tar(FILES, fmt=fmt)
    verifier = verify(blob, manifest_of(FILES), chunk=chunk, tar_size=len(blob),
                      tar_sha256=hashlib.sha256(blob).hexdigest())
    assert verifier.size == len(blob) and verifier.sha256 == hashlib.sha256(blob).hexdigest()


def refused(blob, manifest, **declared) -> ManifestMismatch:
    with pytest.raises(ManifestMismatch) as caught:
        verify(blob, manifest, **declared)
    return caught.value


def test_an_extra_file_is_named():
    error = refused(make_tar({**FILES, "extra.txt": b"x"}), manifest_of(FILES))
    assert error.what == "manifest" and "extra.txt" in error.detail


def test_a_missing_file_is_named():
    error = refused(make_tar({"model.pt": FILES["model.pt"]}), manifest_of(FILES))
    assert error.what == "manifest" and "optim/state.pt" in error.detail


def test_a_changed_byte_is_a_sha256_mismatch():
    changed = {**FILES, "model.pt": b"w" * 2999 + b"X"}
    error = refused(make_tar(changed), manifest_of(FILES))
    assert error.what == "sha256" and "model.pt" in error.detail


def test_a_size_difference_is_named():
    error = refused(make_tar({**FILES, "model.pt": b"w" * 10}), manifest_of(FILES))
    assert error.what == "size" and "model.pt" in error.detail


@pytest.mark.parametrize("name", ["../evil", "/etc/passwd", "a/../b", "./a", "a//b"])
def test_unsafe_paths_are_refused(name):
    error = refused(make_tar({name: b"x"}), [ManifestFile(name, 1, hashlib.sha256(b"x").hexdigest())])
    assert error.what == "path"


def test_a_duplicate_path_is_refused():
    def twice(tar):
        info = tarfile.TarInfo("model.pt")
        info.size = 3000
        tar.addfile(info, io.BytesIO(b"w" * 3000))

    assert refused(make_tar(FILES, extra=twice), manifest_of(FILES)).what == "path"


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE])
def test_links_directories_and_special_files_are_refused(kind):
    def add(tar):
        info = tarfile.TarInfo("odd")
        info.type = kind
        info.linkname = "model.pt" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
        tar.addfile(info)

    assert refused(make_tar(FILES, extra=add), manifest_of(FILES)).what == "tar"


def test_not_a_tar_is_refused():
    assert refused(b"PK\x03\x04" + b"z" * 2000, manifest_of(FILES)).what == "tar"


def test_a_cut_off_upload_is_truncated():
    blob = make_tar(FILES)
    assert refused(blob[:1700], manifest_of(FILES)).what == "tar"


def test_declared_size_and_sha256_are_checked():
    blob = make_tar(FILES)
    assert refused(blob, manifest_of(FILES), tar_size=len(blob) - 512).what == "size"
    assert refused(blob, manifest_of(FILES), tar_sha256="0" * 64).what == "sha256"


def test_trailing_garbage_after_the_end_is_refused():
    assert refused(make_tar(FILES) + b"junk", manifest_of(FILES)).what == "tar"


def test_a_manifest_that_arrives_after_the_bytes_is_compared_then():
    blob = make_tar(FILES)
    verifier = verify(blob, None)
    verifier.check_manifest(manifest_of(FILES))
    assert set(verifier.members) == set(FILES)
    with pytest.raises(ManifestMismatch) as caught:
        verifier.check_manifest(manifest_of({**FILES, "model.pt": b"other"}))
    assert caught.value.what in ("size", "sha256") and "model.pt" in caught.value.detail
    with pytest.raises(ManifestMismatch) as caught:
        verifier.check_manifest(manifest_of({**FILES, "late.bin": b""}))
    assert caught.value.what == "manifest" and "late.bin" in caught.value.detail
