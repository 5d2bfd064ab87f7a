"""Each limit of docs/checkpoint-format.md#limits-settings holds, deep trees never recurse, and a body too large for the
API gets its JSON error (docs/design/checkpoints.md#tar-format; docs/design/house.md#verify-first)."""

import os
import tracemalloc

import pytest

from checkpoints.services.declaration import clean_declaration
from mado.errors import ValidationFailed
from mado_tracking.extractdir import remove_tree
from mado_tracking.tarformat import Limits, TarReader
from tests.checkpoints.tar_corpus import END, member, sha
from tests.worker.helpers import stored_checkpoint
from worker.errors import CheckpointMismatch
from worker.fetch import restore_checkpoint
from worker.janitor import remove_ended_workdirs

pytestmark = pytest.mark.django_db


class _Sink:
    def begin(self, member):
        pass

    def data(self, view):
        pass

    def end(self):
        pass


def read(tar: bytes, limits: Limits) -> TarReader:
    reader = TarReader(_Sink(), limits=limits)
    reader.feed(tar)
    reader.finish()
    return reader


def upload(api, creator, run, tar: bytes, step: int):
    client = api(creator)
    cid = client.post(f"/api/v1/runs/{run.pk}/checkpoints/", {"step": step}, format="json").json()["id"]
    return client.put(f"/api/v1/checkpoints/{cid}/tar", data=tar, content_type="application/x-tar")


def test_a_path_deeper_than_the_depth_limit_is_refused_at_upload(api, creator, run, settings):
    deep = "/".join(["d"] * 64 + ["model.pt"])
    answer = upload(api, creator, run, member(deep, b"w", "pax") + END, 1)
    assert answer.status_code == 400
    assert "path of 65 levels is deeper than 64 levels" in answer.json()["detail"]
    settings.MADO_TAR_LIMITS = Limits(depth=3)
    answer = upload(api, creator, run, member("a/b/c/d.pt", b"w", "ustar") + END, 2)
    assert "path of 4 levels is deeper than 3 levels" in answer.json()["detail"]
    assert upload(api, creator, run, member("a/b/d.pt", b"w", "ustar") + END, 3).status_code == 200


def test_more_name_bytes_than_the_limit_are_refused_in_a_tar_and_in_a_manifest(api, creator, run, settings):
    settings.MADO_TAR_LIMITS = Limits(name_bytes=100)
    names = [f"{'n' * 30}{i}.pt" for i in range(4)]  # 34 bytes each: the third passes 100
    answer = upload(api, creator, run, b"".join(member(n, b"w", "ustar") for n in names) + END, 1)
    assert answer.status_code == 400
    assert f"member 3 '{names[2]}': the names hold more than 100 bytes in all" in answer.json()["detail"]
    entries = [{"path": n, "size": 1, "sha256": "0" * 64} for n in names]
    with pytest.raises(ValidationFailed, match="the names hold more than 100 bytes in all") as refused:
        clean_declaration(tar_size=1, tar_sha256=None, manifest=entries, manifest_sha256=None)
    assert refused.value.field == "manifest[2].path"


def test_a_file_that_another_path_needs_as_a_directory_is_refused_in_either_order():
    for names in (["model", "model/a.bin"], ["model/a.bin", "model"], ["A/x.pt", "a/y.pt"], ["a/b/c", "A/b"]):
        with pytest.raises(Exception, match="path mismatch") as refused:
            read(b"".join(member(n, b"w", "ustar") for n in names) + END, Limits())
        assert "directory" in str(refused.value), names


def test_memory_of_the_reader_grows_with_the_names_not_with_the_square_of_their_depth():
    """400 paths of 2,000 levels (1.6 MB of names), each under its own top directory: the reader kept every
    directory above every path before, about 1.6 GB."""
    limits = Limits(depth=10_000)
    tar = b"".join(member(f"{i}/" + "d/" * 1998 + "f", b"", "pax") for i in range(400)) + END
    tracemalloc.start()
    try:
        reader = read(tar, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reader.count == 400
    assert peak < 16 * 1024 * 1024, peak


def deep_directory(root, levels: int) -> None:
    """``levels`` nested directories below ``root``, a read-only file at the bottom, the directories read-only."""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o400, dir_fd=fd))
    os.fchmod(fd, 0o500)
    os.close(fd)


def test_a_checkpoint_a_thousand_levels_deep_is_refused_at_restore_and_leaves_nothing(run, tmp_path):
    """Completed before the depth limit existed: the restore now refuses it (it failed with a recursion error and
    left its staging tree before)."""
    checkpoint = stored_checkpoint(run, 1, {"/".join(["d"] * 1000 + ["model.pt"]): b"weights"})
    workdir = tmp_path / "job-1"
    workdir.mkdir()
    with pytest.raises(CheckpointMismatch, match="path of 1001 levels is deeper than 64 levels"):
        restore_checkpoint(checkpoint=checkpoint, workdir=workdir, backoff_s=0)
    assert list(workdir.iterdir()) == []


def test_a_checkpoint_a_thousand_levels_deep_restores_under_a_raised_limit_and_is_removed(run, tmp_path, settings):
    settings.MADO_TAR_LIMITS = Limits(depth=2000)
    os.environ["MADO_TAR_MAX_DEPTH"] = "2000"
    try:
        deep = "/".join(["d"] * 1000 + ["model.pt"])
        checkpoint = stored_checkpoint(run, 1, {deep: b"weights", "top.pt": b"top"})
        workdir = tmp_path / "job-2"
        workdir.mkdir()
        restore_checkpoint(checkpoint=checkpoint, workdir=workdir, backoff_s=0)
    finally:
        del os.environ["MADO_TAR_MAX_DEPTH"]
    restored = next(p for p in workdir.iterdir())
    assert (restored / "top.pt").read_bytes() == b"top"
    remove_tree(workdir)
    assert not workdir.exists()


def test_the_worker_removes_an_ended_jobs_directory_a_thousand_levels_deep(tmp_path, settings):
    """User code may leave any tree; the clean-up of ended Jobs removes it (it raised a recursion error)."""
    job_dir = tmp_path / "job-987654"
    job_dir.mkdir()
    deep_directory(job_dir, 1500)
    assert remove_ended_workdirs(tmp_path) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_body_over_the_api_limit_gets_json_naming_the_limit(api, creator, run, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200_000
    client = api(creator)
    cid = client.post(f"/api/v1/runs/{run.pk}/checkpoints/", {"step": 1}, format="json").json()["id"]
    entries = [{"path": f"d/f{i}", "size": 0, "sha256": sha(b"")} for i in range(3000)]
    answer = client.post(f"/api/v1/checkpoints/{cid}/complete/", {"tar_size": 1, "manifest": entries}, format="json")
    assert answer.status_code == 413
    assert answer["Content-Type"] == "application/json"
    body = answer.json()
    assert body["error"] == "too_large"
    assert "larger than 200000 bytes" in body["detail"] and "manifest_sha256" in body["detail"]


def test_the_sdk_refuses_a_directory_deeper_than_the_limit_before_walking_it(tmp_path):
    """The save side: a user's directory 1,500 levels deep is refused by name, not by a recursion error."""
    from mado_tracking.errors import CheckpointError
    from mado_tracking.tarstream import CheckpointTar

    deep_directory(tmp_path, 1500)
    with pytest.raises(CheckpointError, match="path of 65 levels is deeper than 64 levels"):
        CheckpointTar(tmp_path)
    remove_tree(tmp_path)


def test_a_code_archive_may_nest_deeper_than_a_checkpoint(tmp_path):
    """Source trees keep their own, larger depth limit: 200 levels extract (a checkpoint stops at 64)."""
    from tests.worker.helpers import tar_gz
    from worker.extract import extract_code_archive

    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(tar_gz([("/".join(["pkg"] * 200 + ["main.py"]), b"print(1)\n")]))
    (tmp_path / "job").mkdir()
    code = extract_code_archive(archive_path=archive, workdir=tmp_path / "job", label="code v1")
    assert (code / "/".join(["pkg"] * 200) / "main.py").read_bytes() == b"print(1)\n"
    remove_tree(tmp_path / "job")
