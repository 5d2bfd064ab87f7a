"""Points of a Run the server ended ``crashed`` are kept for its resume (docs/design/runs.md#liveness): one warning
per run and no disk write on the training thread; found again under any spelling of the server's URL, and a
resume that finds them kept for another server says so."""

import json
import logging
import threading
import time

import pytest

import mado_tracking
from mado_tracking import unsent
from mado_tracking.config import server_identity
from mado_tracking.staging import run_staging_dir
from tests.sdk.resume_stub import ResumeStubApi, points_of


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMT_CACHE_DIR", str(tmp_path / "cache"))


def _start(url: str, **kwargs):
    return mado_tracking.start_run(project="vision", api_url=url, api_token="stub-token", id="exp-1", **kwargs)


def _lose(run) -> None:
    run.log_metrics({"loss": 0.0}, step=0)
    run._sender._wake.set()
    deadline = time.monotonic() + 20
    while not run.lost:
        assert time.monotonic() < deadline, "the run was never lost"
        time.sleep(0.01)


def test_a_crashed_run_keeps_many_points_with_one_warning_and_few_disk_writes(monkeypatch, caplog):
    fsyncs = []  # the thread each fsync ran on, and whether the training loop was running then
    in_loop = threading.Event()
    real_fsync = unsent.os.fsync
    monkeypatch.setattr(
        unsent.os, "fsync", lambda fd: (fsyncs.append((threading.current_thread(), in_loop.is_set())), real_fsync(fd))
    )
    with ResumeStubApi(resumed=False) as stub, caplog.at_level(logging.WARNING, logger="mado_tracking"):
        stub.ended = True
        run = _start(stub.url)
        _lose(run)
        in_loop.set()
        for step in range(1, 5001):
            run.log_metrics({"loss": 1.0 / step}, step=step)
        in_loop.clear()
        run.finish()
    kept = run_staging_dir(api_url=stub.url, project="vision", external_id="exp-1") / unsent.FILE_NAME
    steps = [json.loads(line)[2] for line in kept.read_text().splitlines()]
    assert steps == list(range(5001))
    warnings = [r.getMessage() for r in caplog.records if "kept in" in r.getMessage()]
    assert warnings == [
        f"mado: run exp-1 ended on the server; its metric points are kept in {kept} from now on and sent by a "
        "resume of this run (its id with resume='allow')"
    ]
    training = threading.main_thread()
    assert [thread.name for thread, looping in fsyncs if looping and thread is training] == []
    assert 1 <= len(fsyncs) <= 4  # about once a second and at finish, never once per call


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("http://127.0.0.1:8000", "HTTP://LocalHost:8000/"),
        ("http://127.0.0.1:8000", "http://[::1]:8000/api/v1/"),
        ("https://mado.example.com", "https://user@MADO.example.com.:443/"),
        ("http://mado.example.com/base", "http://mado.example.com:80/base/api/v1"),
    ],
)
def test_spellings_of_one_server_have_one_identity(one, other):
    assert server_identity(one) == server_identity(other) == one


def test_other_servers_have_other_identities():
    urls = ("http://a:8000", "http://a:8001", "https://a:8000", "http://b:8000", "http://127.0.0.1:8000")
    assert len({server_identity(url) for url in urls}) == len(urls)
    assert server_identity("http://mado.example.com/a") != server_identity("http://mado.example.com/b")


@pytest.mark.parametrize("spelling", ["http://localhost:{port}/", "HTTP://127.0.0.1:{port}/api/v1/"])
def test_kept_points_are_sent_by_a_resume_under_another_spelling_of_the_same_server(spelling):
    with ResumeStubApi(resumed=False) as stub:
        stub.ended = True
        run = _start(stub.url)
        _lose(run)
        run.log_metrics({"loss": 1.0}, step=1)
        run.finish()
        stub.ended, stub.resumed, stub.last_step = False, True, None
        with _start(spelling.format(port=stub.server.server_port), resume="allow"):
            pass
    assert points_of(stub) == [("loss", 0), ("loss", 1)]


def test_a_resume_names_points_kept_for_another_server_and_leaves_them(caplog):
    with ResumeStubApi(resumed=False) as elsewhere:
        elsewhere.ended = True
        run = _start(elsewhere.url)
        _lose(run)
        run.finish()
    with ResumeStubApi(resumed=True, last_step=None) as here, caplog.at_level(logging.WARNING, logger="mado_tracking"):
        with _start(here.url, resume="allow"):
            pass
    kept = run_staging_dir(api_url=elsewhere.url, project="vision", external_id="exp-1") / unsent.FILE_NAME
    assert here.points == [] and kept.exists()
    assert f"mado: {kept} holds metric points of run exp-1 kept for {elsewhere.url}, not {here.url}" in caplog.text
    assert f"start this run once with MMT_API_URL={elsewhere.url}" in caplog.text


def test_points_an_earlier_sdk_kept_under_the_urls_text_are_sent(tmp_path):
    with ResumeStubApi(resumed=True, last_step=None) as stub:
        spelled = stub.url.replace("127.0.0.1", "localhost")
        import hashlib

        legacy = tmp_path / "cache" / "staging" / hashlib.sha256(spelled.encode()).hexdigest()[:12] / "vision" / "exp-1"
        unsent.keep(legacy, [("loss", 3.0, 3, 1700000000.0)], run_label="exp-1")
        with _start(spelled, resume="allow"):
            pass
    assert points_of(stub) == [("loss", 3)] and not (legacy / unsent.FILE_NAME).exists()
