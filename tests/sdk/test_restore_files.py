"""Restoring a checkpoint saved through MLflow (``layout: "files"``, no tar) outside a Job, against a stub server:
``mado checkpoint restore``, ``extract.restore_checkpoint`` and a same-run resume fetch it file by file, each
file's size and SHA-256 checked against the manifest while it is written; a tampered file, a hostile manifest or
a download that keeps breaking leaves nothing (docs/design/checkpoints.md#mlflow-checkpoints;
docs/design/worker.md#verify, #extract)."""

import json
import stat

import pytest
from click.testing import CliRunner

import mado_tracking
from mado_tracking import ApiError, CheckpointError, checkpoint_cache, download, resume_fetch
from mado_tracking.cli import main
from mado_tracking.client import ApiClient
from mado_tracking.config import Config
from mado_tracking.extract import restore_checkpoint
from tests.sdk.resume_stub import ResumeStubApi
from tests.sdk.test_resume_anywhere_ranks import _rank_1, _Store

FILES = {
    "config.json": b'{"n_layer": 1}',
    "model.safetensors": bytes(range(256)) * 64,
    "optimizer.pt": b"optimizer state" * 300,
    "empty.txt": b"",
    "nested/rng state.pth": b"rng",
    "données/50% #1.bin": b"a name to quote in the URL",
}


@pytest.fixture
def stub(tmp_path, monkeypatch):
    monkeypatch.setenv("MMT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(download.time, "sleep", lambda seconds: None)  # retries without their backoff
    with ResumeStubApi() as api:
        api.add_files_checkpoint(21, 20, FILES)
        yield api


@pytest.fixture
def client(stub):
    client = ApiClient(Config(api_url=stub.url, api_token="stub-token"))
    yield client
    client.close()


def files_below(directory) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_each_file_is_fetched_verified_and_committed_read_only(stub, client, tmp_path):
    variables = restore_checkpoint(client, 21, tmp_path)
    checkpoint = tmp_path / "checkpoint"
    assert files_below(checkpoint) == FILES
    assert stat.S_IMODE((checkpoint / "model.safetensors").stat().st_mode) == 0o444
    assert stat.S_IMODE((checkpoint / "nested").stat().st_mode) == 0o555
    assert json.loads((tmp_path / "resume-checkpoint.json").read_text()) == {
        "checkpointId": 21,
        "sourceRunId": 1,
        "step": 20,
    }
    assert variables["MMT_RESUME_CHECKPOINT_DIR"] == str(checkpoint) and variables["MMT_RESUME_STEP"] == "20"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "resume-checkpoint.json"]
    assert set(stub.file_gets.values()) == {1} and not stub.tar_gets


def test_a_large_file_comes_in_ranged_parts(stub, client, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "PART_BYTES", 1000)
    monkeypatch.setenv("MMT_DOWNLOAD_PARALLEL", "3")
    restore_checkpoint(client, 21, tmp_path)
    assert files_below(tmp_path / "checkpoint") == FILES
    assert stub.file_gets[(21, "model.safetensors")] == -(-len(FILES["model.safetensors"]) // 1000)


@pytest.mark.parametrize(
    ("tamper", "what"),
    [
        (lambda data: b"X" + data[1:], "sha256"),
        (lambda data: data[:-1] + b"!!", "sha256"),  # longer: the server sends the recorded size, which differs
    ],
)
def test_a_tampered_stored_file_is_refused_and_nothing_is_left(stub, client, tmp_path, tamper, what):
    stub.files[21]["optimizer.pt"] = tamper(FILES["optimizer.pt"])
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(CheckpointError) as refused:
        restore_checkpoint(client, 21, into)
    assert str(refused.value).startswith(f"Checkpoint 21 {what} mismatch: 'optimizer.pt' has SHA-256 ")
    assert list(into.iterdir()) == []


def test_a_download_cut_off_once_resumes_where_it_stopped(stub, client, tmp_path):
    stub.cut[(21, "model.safetensors")] = 1
    restore_checkpoint(client, 21, tmp_path)
    assert files_below(tmp_path / "checkpoint") == FILES
    assert stub.file_gets[(21, "model.safetensors")] == 2


def test_a_download_that_keeps_breaking_fails_and_leaves_nothing(stub, client, tmp_path):
    stub.cut[(21, "optimizer.pt")] = 99
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(ApiError, match=r"downloading checkpoint 21 file 'optimizer.pt' failed 5 times"):
        restore_checkpoint(client, 21, into)
    assert list(into.iterdir()) == []


@pytest.mark.parametrize(
    ("entry", "what", "detail"),
    [
        ({"path": "../evil.pt"}, "path", "not a normalised relative path"),
        ({"path": "/etc/evil.pt"}, "path", "absolute"),
        ({"path": "Config.JSON"}, "path", "collides with 'config.json'"),
        ({"path": "config.json/inner"}, "path", "as a directory, but it is a file"),
        ({"path": "model.safetensors"}, "path", "appears twice"),
        ({"path": "nul"}, "path", "device name on Windows"),
        ({"size": -1}, "manifest", "not a whole number of bytes"),
        ({"sha256": "z" * 64}, "manifest", "not 64 hex digits"),
        ({"path": 7}, "manifest", "not text"),
    ],
)
def test_a_hostile_manifest_is_refused_before_any_byte_is_fetched(stub, client, tmp_path, entry, what, detail):
    stub.checkpoints[21]["manifest"].append({"path": "extra.bin", "size": 1, "sha256": "0" * 64, **entry})
    with pytest.raises(CheckpointError, match=rf"^Checkpoint 21 {what} mismatch: .*{detail}"):
        restore_checkpoint(client, 21, tmp_path)
    assert not stub.file_gets and not (tmp_path / "checkpoint").exists()


def test_mado_checkpoint_restore_extracts_it(stub, tmp_path):
    env = {"MMT_API_URL": stub.url, "MMT_API_TOKEN": "stub-token"}
    done = CliRunner().invoke(main, ["checkpoint", "restore", "21", "--into", str(tmp_path / "in")], env=env)
    assert done.exit_code == 0, done.output
    assert files_below(tmp_path / "in" / "checkpoint") == FILES
    shown = CliRunner().invoke(main, ["checkpoint", "show", "21"], env=env)
    assert "stored as: separate files, saved through MLflow (no tar)" in shown.output
    stub.files[21]["config.json"] = b'{"n_layer": 9}'
    done = CliRunner().invoke(main, ["checkpoint", "restore", "21", "--into", str(tmp_path / "again")], env=env)
    assert done.exit_code == 1 and "Checkpoint 21 sha256 mismatch: 'config.json'" in done.output
    assert not (tmp_path / "again").exists()


def test_download_checkpoint_says_how_to_restore_one(stub):
    with pytest.raises(CheckpointError, match=r"checkpoint 21 is made of separate files .*mado checkpoint restore 21"):
        mado_tracking.download_checkpoint(21, "out.tar", api_url=stub.url, api_token="stub-token")


def _resume(stub):
    return mado_tracking.start_run(
        project="vision", api_url=stub.url, api_token="stub-token", id="exp-1", resume="must"
    )


def test_a_same_run_resume_caches_it_keyed_on_the_manifest_and_reuses_it(stub):
    with _resume(stub) as run:
        first = run.resume_checkpoint()
    assert (first.step, first.id) == (20, 21) and files_below(first.path) == FILES
    record = json.loads((first.path.parent / checkpoint_cache.RECORD_FILE).read_text())
    assert record["layout"] == "files" and record["key"] == checkpoint_cache.content_key(stub.checkpoints[21])
    assert record["key"].startswith("files:") and record["tar_sha256"] == ""
    with _resume(stub) as again:
        assert again.resume_checkpoint().path == first.path
    assert set(stub.file_gets.values()) == {1}  # reused: nothing fetched twice


def test_a_cached_copy_of_another_manifest_is_replaced(stub):
    with _resume(stub) as run:
        run.resume_checkpoint()
    changed = {**FILES, "config.json": b'{"n_layer": 2}'}
    stub.add_files_checkpoint(21, 20, changed)  # the same id with other files: the record no longer fits
    with _resume(stub) as run:
        assert files_below(run.resume_checkpoint().path) == changed
    assert stub.file_gets[(21, "config.json")] == 2


def test_under_torchrun_another_rank_finds_rank_0s_copy_by_its_manifest_key(stub, monkeypatch):
    with _resume(stub) as run:
        on_rank_0 = resume_fetch._encode(run.resume_checkpoint())
    assert on_rank_0["key"] == checkpoint_cache.content_key(stub.checkpoints[21])
    store = _Store()
    store.set(resume_fetch._KEY.format(1, 2), json.dumps({"found": on_rank_0}))
    rank_1 = _rank_1(stub, monkeypatch, store)
    found = rank_1.resume_checkpoint()
    rank_1.finish()
    assert str(found.path) == on_rank_0["path"] and set(stub.file_gets.values()) == {1}  # the same copy, no fetch
