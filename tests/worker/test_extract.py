"""A checkpoint is downloaded, verified and extracted in one pass: each regular file written by us (hashed as it
is written) into a fresh temporary directory, renamed into place read-only, never outside it, nothing partial
left behind (docs/design/worker.md#verify, #extract; docs/design/house.md#verify-first). Code archives follow the same
format rules."""

import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from mado_tracking.extractdir import ExtractionDir
from mado_tracking.tarverify import ManifestFile, manifest_digest
from tests.worker.helpers import FILES, make_tar, manifest, member, sha, stored_checkpoint, tar_gz, zip_bytes
from worker import extract as extract_module
from worker.errors import ArchiveRejected, CheckpointMismatch
from worker.extract import (
    extract_code_archive,
    remove_tree,
    write_resume_info,
)
from worker.fetch import restore_checkpoint

DEEP = {
    "model.pt": b"weights" * 1000,
    "optim/state.pt": b"s" * 700,
    "empty.bin": b"",
    "a/b/c/" + "long" * 40 + ".bin": b"deep" * 100,
}


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "job-1"
    path.mkdir()
    return path


@pytest.fixture
def extract(run):
    """``extract(workdir, data, files=DEEP)``: restore a checkpoint recorded for ``files`` and the tar ``data``."""
    steps = iter(range(1, 1000))

    def restore(workdir, data: bytes, files=None):
        checkpoint = stored_checkpoint(run, next(steps), DEEP if files is None else files, recorded=data)
        return restore_checkpoint(checkpoint=checkpoint, workdir=workdir, backoff_s=0).checkpoint_dir

    return restore


def leftovers(workdir: Path) -> list[str]:
    return sorted(p.name for p in workdir.iterdir())


def test_files_are_extracted_read_only(workdir, extract):
    target = extract(workdir, make_tar(DEEP))
    assert target == workdir / "checkpoint"
    found = {str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert found == DEEP
    for path in [target, *target.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o555 if path.is_dir() else 0o444), (path, oct(mode))
        assert not path.is_symlink()
    assert leftovers(workdir) == ["checkpoint"]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_every_tar_format_with_long_names_is_read(workdir, extract, fmt):
    files = {"x" * 90 + "/" + "y" * 90 + ".bin": b"long", "model.pt": b"m"}
    target = extract(workdir, make_tar(files, fmt=fmt), files)
    assert (target / ("x" * 90) / ("y" * 90 + ".bin")).read_bytes() == b"long"


def test_the_sdk_tar_stream_is_extracted(workdir, extract, tmp_path):
    """The tar the SDK builds (``mado_tracking.tarstream.CheckpointTar``) is what storage holds: it extracts."""
    from mado_tracking.tarstream import CheckpointTar

    source = tmp_path / "ckpt"
    for path, data in DEEP.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(data)
    target = extract(workdir, b"".join(CheckpointTar(source)))
    assert {str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()} == DEEP


@pytest.fixture
def refused(extract):
    def check(workdir, data: bytes, files=None) -> CheckpointMismatch:
        with pytest.raises(CheckpointMismatch) as caught:
            extract(workdir, data, files)
        assert leftovers(workdir) == [], "no partial or temporary directory may stay behind"
        assert str(caught.value).startswith(f"Checkpoint {caught.value.checkpoint_id} {caught.value.what} mismatch: ")
        return caught.value

    return check


@pytest.mark.parametrize(
    "extra, what",
    [
        (member("extra.txt", b"x"), "manifest"),
        (member("../outside.txt", b"x"), "path"),
        (member("/tmp/absolute.txt", b"x"), "path"),
        (member("link", kind=tarfile.SYMTYPE, linkname="/etc"), "tar"),
        (member("hard", kind=tarfile.LNKTYPE, linkname="model.pt"), "tar"),
        (member("fifo", kind=tarfile.FIFOTYPE), "tar"),
        (member("model.pt", b"weights" * 1000), "path"),  # a duplicate
    ],
)
def test_a_bad_header_is_refused_and_nothing_stays_behind(workdir, refused, extra, what):
    files = {**DEEP, extra[0]: extra[1]} if extra[0] in ("../outside.txt", "/tmp/absolute.txt") else DEEP
    error = refused(workdir, make_tar(DEEP, extra=[extra]), files)
    assert error.what == what
    assert not (workdir.parent / "outside.txt").exists() and not Path("/tmp/absolute.txt").exists()


def test_a_directory_member_is_created(workdir, extract):
    target = extract(workdir, make_tar(DEEP, extra=[member("logs", kind=tarfile.DIRTYPE)]))
    assert (target / "logs").is_dir() and list((target / "logs").iterdir()) == []


def test_a_missing_file_is_refused(workdir, refused):
    files = {k: v for k, v in DEEP.items() if k != "empty.bin"}
    assert "missing from the tar: 'empty.bin'" in str(refused(workdir, make_tar(files)))


def test_a_size_difference_is_refused(workdir, refused):
    assert refused(workdir, make_tar({**DEEP, "model.pt": b"short"})).what == "size"


def test_a_content_difference_found_while_writing_leaves_no_partial_directory(workdir, refused):
    """The headers match, the third file's bytes do not: two files were written, then everything goes."""
    tampered = {**DEEP, "optim/state.pt": b"S" * 700}
    error = refused(workdir, make_tar(tampered))
    assert error.what == "sha256" and "optim/state.pt" in error.detail


def test_a_truncated_tar_is_refused(workdir, refused):
    data = make_tar(DEEP)
    assert refused(workdir, data[:5000]).what == "tar"


def test_a_corrupted_header_is_refused(workdir, refused):
    data = bytearray(make_tar(DEEP))
    data[10] ^= 0xFF
    assert "bad header checksum" in refused(workdir, bytes(data)).detail


def test_an_existing_target_is_never_replaced(workdir, extract):
    (workdir / "checkpoint").mkdir()
    with pytest.raises(FileExistsError):
        extract(workdir, make_tar(DEEP))
    assert list((workdir / "checkpoint").iterdir()) == []


def test_nothing_is_ever_written_through_a_link_in_the_staging_directory(workdir, tmp_path):
    """Defence in depth: even if a link appeared inside the temporary directory, no file goes through it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    staging = ExtractionDir(workdir, ".t-", lambda what, detail: CheckpointMismatch(1, what, detail))
    with staging:
        os.symlink(outside, os.path.join(staging.root, "a"))
        with pytest.raises(CheckpointMismatch, match="path mismatch"):
            staging.write_file("a/b.txt", [b"x"], mode=0o444)
        os.symlink(outside / "file", os.path.join(staging.root, "c"))
        with pytest.raises(CheckpointMismatch, match="path mismatch"):
            staging.write_file("c", [b"x"], mode=0o444)
    assert list(outside.iterdir()) == []
    assert leftovers(workdir) == []


def test_resume_info_names_the_checkpoint_and_its_manifest_digest(workdir, run):
    from tests.worker.helpers import stored_checkpoint

    checkpoint = stored_checkpoint(run, 20)
    path = write_resume_info(workdir=workdir, checkpoint=checkpoint, manifest=manifest(FILES))
    assert path == workdir / "resume-checkpoint.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert json.loads(path.read_text()) == {
        "checkpointId": checkpoint.pk,
        "sourceRunId": run.pk,
        "step": 20,
        "manifestSha256": manifest_digest(manifest(FILES)),
        "framework": "pytorch",
        "includesOptimizer": True,
    }


def test_the_manifest_digest_is_the_sha256_of_the_canonical_json():
    files = [ManifestFile("b", 1, "bb"), ManifestFile("a/é", 2, "aa")]
    canonical = '[{"path":"a/é","sha256":"aa","size":2},{"path":"b","sha256":"bb","size":1}]'
    assert manifest_digest(files) == sha(canonical.encode("utf-8"))
    assert manifest_digest(reversed(files)) == manifest_digest(files)


def test_remove_tree_removes_read_only_trees(workdir, extract):
    target = extract(workdir, make_tar(DEEP))
    remove_tree(target)
    assert not target.exists()
    remove_tree(target)  # missing is fine


# --- Code archives --------------------------------------------------------------------------


def code(workdir, data: bytes, name="code.tar.gz") -> Path:
    path = workdir / name
    path.write_bytes(data)
    return extract_code_archive(archive_path=path, workdir=workdir, label="Code version 3 archive")


def code_refused(workdir, data: bytes, match: str):
    with pytest.raises(ArchiveRejected, match=match) as caught:
        code(workdir, data)
    assert sorted(p.name for p in workdir.iterdir()) == ["code.tar.gz"]
    assert str(caught.value).startswith("Code version 3 archive rejected")


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz", "w"])
def test_a_code_tar_is_extracted_with_its_directories_and_executable_bits(workdir, mode):
    target = code(
        workdir,
        tar_gz(
            [
                ("./", None),
                ("./pkg", None),
                ("./train.py", b"print('hi')\n"),
                ("./pkg/__init__.py", b""),
                ("./run.sh", b"#!/bin/sh\n"),
            ],
            mode=mode,
        ),
    )
    assert (target / "train.py").read_text() == "print('hi')\n"
    assert (target / "pkg" / "__init__.py").exists()
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "train.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((target / "pkg").stat().st_mode) == 0o755


def test_a_code_zip_is_extracted(workdir):
    target = code(workdir, zip_bytes({"train.py": b"print(1)\n", "lib/util.py": b"x = 1\n", "lib/": b""}), "c.zip")
    assert (target / "lib" / "util.py").read_text() == "x = 1\n"


@pytest.mark.parametrize(
    "entries, match",
    [
        ([("train.py", b"x"), ("evil", b"", tarfile.SYMTYPE, "/etc/passwd")], "symbolic link"),
        ([("train.py", b"x"), ("hard", b"", tarfile.LNKTYPE, "train.py")], "hard link"),
        ([("../escape.py", b"x")], r"\.\."),
        ([("/abs.py", b"x")], "absolute"),
        ([("a.py", b"x"), ("a.py", b"y")], "appears twice"),
        ([("a", b"x"), ("a/b.py", b"y")], "is a file"),
    ],
)
def test_an_unsafe_code_tar_is_rejected_and_leaves_nothing(workdir, entries, match):
    code_refused(workdir, tar_gz(entries), match)
    assert not (workdir.parent / "escape.py").exists()


def test_an_unsafe_code_zip_is_rejected(workdir):
    code_refused(workdir, zip_bytes({"ok.py": b"x"}, symlinks={"link": "/etc/passwd"}), "symbolic link")
    code_refused(workdir, zip_bytes({"../up.py": b"x"}), r"\.\.")


def test_a_corrupt_code_archive_is_rejected(workdir):
    data = tar_gz([("train.py", b"x" * 10000)])
    code_refused(workdir, data[: len(data) // 2], "cannot be read|truncated")
    code_refused(workdir, b"not an archive at all" * 100, "tar")


def test_a_code_archive_beyond_the_limit_is_rejected(workdir, monkeypatch):
    monkeypatch.setattr(extract_module, "CODE_MAX_BYTES", 1000)
    code_refused(workdir, tar_gz([("big.bin", b"0" * 2000)]), "more than 1000 bytes")
