"""``run.log_checkpoint`` against the real API on a live server (docs/design/checkpoints.md#a-checkpoint).

Happy path, every refusal before any upload, the duplicate step, retries of a
broken upload (a connection cut half-way through the body, a 503), and the
metric points logged before a checkpoint reaching the server first.
"""

import hashlib
import os
import socket
import threading
from urllib.parse import urlsplit

import pytest
import requests

import mado_tracking
from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking import CheckpointError, checkpoints
from runs.models import MetricPoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch):
    monkeypatch.setattr(checkpoints, "BACKOFF_BASE_S", 0.05)
    monkeypatch.setattr(checkpoints, "BACKOFF_CAP_S", 0.2)


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path / "ckpt"
    (root / "optim").mkdir(parents=True)
    (root / "model.pt").write_bytes(os.urandom(3 << 20))
    (root / "optim" / "state.pt").write_bytes(b"s" * 700)
    (root / "empty.bin").write_bytes(b"")
    return root


def _manifest(root) -> list[dict]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return [
        {
            "path": p.relative_to(root).as_posix(),
            "size": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in files
    ]


class RequestCounter:
    """Counts every HTTP request made through ``requests`` while installed."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = requests.Session.request

        def counting(session, method, url, *args, **kwargs):
            self.calls.append((method, url))
            return original(session, method, url, *args, **kwargs)

        monkeypatch.setattr(requests.Session, "request", counting)


def test_a_checkpoint_is_stored_complete_with_the_manifest_of_its_files(mmt_env, ckpt):
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(ckpt, step=10, includes_optimizer=True, framework="torch")
    stored = Checkpoint.objects.get(pk=saved.id)
    assert (stored.run_id, stored.step, stored.state) == (run.id, 10, CheckpointState.COMPLETE)
    assert (stored.framework, stored.includes_optimizer) == ("torch", True)
    assert saved.step == 10 and saved.sha256 == stored.tar_sha256 and saved.tar_size == stored.tar_size
    assert stored.artifact.path == "checkpoints/step-10.tar"
    assert list(stored.manifest.order_by("path").values("path", "size", "sha256")) == _manifest(ckpt)
    assert (stored.file_count, stored.total_bytes) == (3, (3 << 20) + 700)


def test_the_downloaded_tar_is_the_one_the_sdk_hashed(mmt_env, ckpt):
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(ckpt, step=0)
    answer = requests.get(
        f"{mmt_env['MMT_API_URL']}/api/v1/checkpoints/{saved.id}/tar",
        headers={"Authorization": f"Bearer {mmt_env['MMT_API_TOKEN']}"},
        timeout=30,
    )
    assert answer.status_code == 200
    assert hashlib.sha256(answer.content).hexdigest() == saved.sha256


def _link(root):
    (root / "optim" / "link").symlink_to(root / "model.pt")
    return "optim/link: is a symbolic link"


def _empty_subdirectory(root):
    (root / "logs").mkdir()
    return "logs: empty directory"


def _fifo(root):
    os.mkfifo(root / "pipe")
    return "pipe: is not a regular file"


@pytest.mark.parametrize("spoil", [_link, _empty_subdirectory, _fifo])
def test_a_directory_that_cannot_be_a_checkpoint_is_refused_before_any_request(mmt_env, ckpt, monkeypatch, spoil):
    reason = spoil(ckpt)
    with mado_tracking.start_run() as run:
        counter = RequestCounter(monkeypatch)
        with pytest.raises(CheckpointError, match=reason):
            run.log_checkpoint(ckpt, step=1)
        assert counter.calls == []
    assert not Checkpoint.objects.exists()


def test_an_empty_or_missing_directory_is_refused_naming_it(mmt_env, tmp_path, monkeypatch):
    (tmp_path / "nothing").mkdir()
    with mado_tracking.start_run() as run:
        counter = RequestCounter(monkeypatch)
        with pytest.raises(CheckpointError, match="nothing: empty directory"):
            run.log_checkpoint(tmp_path / "nothing", step=1)
        with pytest.raises(CheckpointError, match="missing: is not a directory"):
            run.log_checkpoint(tmp_path / "missing", step=1)
        assert counter.calls == []
    assert not Checkpoint.objects.exists()


@pytest.mark.parametrize("step", [-1, 1.5, "3", True])
def test_a_negative_or_non_integer_step_is_refused_before_any_request(mmt_env, ckpt, monkeypatch, step):
    with mado_tracking.start_run() as run:
        counter = RequestCounter(monkeypatch)
        with pytest.raises(CheckpointError, match=f"{ckpt}: step must be"):
            run.log_checkpoint(ckpt, step=step)
        assert counter.calls == []
    assert not Checkpoint.objects.exists()


def test_saving_a_step_twice_in_a_run_is_refused_without_a_second_upload(mmt_env, ckpt, monkeypatch):
    with mado_tracking.start_run() as run:
        run.log_checkpoint(ckpt, step=5)
        counter = RequestCounter(monkeypatch)
        with pytest.raises(CheckpointError, match="step 5 is already saved in run"):
            run.log_checkpoint(ckpt, step=5)
        assert counter.calls == []
    assert Checkpoint.objects.filter(step=5).count() == 1


def test_a_step_saved_by_another_process_is_a_clear_error_from_the_server(mmt_env, ckpt):
    with mado_tracking.start_run() as run:
        other = requests.post(
            f"{mmt_env['MMT_API_URL']}/api/v1/runs/{run.id}/checkpoints/",
            json={"step": 7},
            headers={"Authorization": f"Bearer {mmt_env['MMT_API_TOKEN']}", "Idempotency-Key": "another-process"},
            timeout=30,
        )
        assert other.status_code == 201
        with pytest.raises(CheckpointError, match="step 7 is already saved in this run") as caught:
            run.log_checkpoint(ckpt, step=7)
    assert caught.value.field == "step"
    assert Checkpoint.objects.filter(step=7).count() == 1


def _cut_put(session: requests.Session, url: str, tar) -> None:
    """Send the headers and half of the body over a raw socket, then drop the connection (a broken upload)."""
    parts = urlsplit(url)
    head = (
        f"PUT {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: {session.headers['Authorization']}\r\nContent-Type: application/x-tar\r\n"
        f"Content-Length: {len(tar)}\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(head.encode())
        sent = 0
        for chunk in tar:
            sock.sendall(chunk)
            sent += len(chunk)
            if sent > len(tar) // 2:
                break
    raise requests.ConnectionError("connection reset by the test")


def test_a_broken_upload_is_sent_again_and_completes(mmt_env, ckpt, monkeypatch):
    with mado_tracking.start_run() as run:
        session = run._client.session
        original, puts = session.put, []

        def flaky_put(url, data=None, **kwargs):
            puts.append(url)
            if len(puts) == 1:
                _cut_put(session, url, data)
            return original(url, data=data, **kwargs)

        monkeypatch.setattr(session, "put", flaky_put)
        saved = run.log_checkpoint(ckpt, step=3)
    assert len(puts) == 2 and puts[0] == puts[1]
    stored = Checkpoint.objects.get()
    assert stored.pk == saved.id and stored.state == CheckpointState.COMPLETE
    assert list(stored.manifest.order_by("path").values("path", "size", "sha256")) == _manifest(ckpt)


def test_a_server_error_on_the_upload_is_retried(mmt_env, ckpt, monkeypatch):
    with mado_tracking.start_run() as run:
        session = run._client.session
        original, answers = session.put, []

        def unavailable_once(url, data=None, **kwargs):
            if not answers:
                response = requests.Response()
                response.status_code, response._content = 503, b'{"error": "unavailable", "detail": "busy"}'
                answers.append(503)
                return response
            response = original(url, data=data, **kwargs)
            answers.append(response.status_code)
            return response

        monkeypatch.setattr(session, "put", unavailable_once)
        saved = run.log_checkpoint(ckpt, step=4)
    assert answers == [503, 200]
    assert Checkpoint.objects.get(pk=saved.id).state == CheckpointState.COMPLETE


def test_a_save_that_failed_can_be_tried_again_for_the_same_step(mmt_env, ckpt, monkeypatch):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "0")
    with mado_tracking.start_run() as run:
        session = run._client.session
        original = session.put
        monkeypatch.setattr(session, "put", lambda url, data=None, **kw: _cut_put(session, url, data))
        with pytest.raises(mado_tracking.ApiError, match="failed 1 times"):
            run.log_checkpoint(ckpt, step=6)
        assert Checkpoint.objects.get().state == CheckpointState.PENDING
        monkeypatch.setattr(session, "put", original)
        saved = run.log_checkpoint(ckpt, step=6)  # the same registration is replayed, not a 409
    assert Checkpoint.objects.get().pk == saved.id
    assert Checkpoint.objects.get().state == CheckpointState.COMPLETE


def test_metric_points_logged_before_a_checkpoint_are_stored_before_it(mmt_env, ckpt, monkeypatch):
    seen_at_register = []
    register = checkpoints._register

    def spy(client, **kwargs):
        seen_at_register.append(MetricPoint.objects.filter(run_id=kwargs["run_id"]).count())
        return register(client, **kwargs)

    monkeypatch.setattr(checkpoints, "_register", spy)
    with mado_tracking.start_run() as run:
        for step in range(10):
            run.log_metrics({"train.loss": 1.0 / (step + 1)}, step=step)
        run.log_checkpoint(ckpt, step=10)
    assert seen_at_register == [10]


def test_log_checkpoint_after_finish_is_an_error(mmt_env, ckpt):
    run = mado_tracking.start_run()
    run.finish()
    with pytest.raises(mado_tracking.MadoError, match="finished"):
        run.log_checkpoint(ckpt, step=1)


def test_download_checkpoint_resumes_a_broken_download_and_checks_the_digest(mmt_env, ckpt, tmp_path, monkeypatch):
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(ckpt, step=2)
    calls = []
    get = requests.Session.get

    def broken_once(session, url, headers=None, **kwargs):
        calls.append(dict(headers or {}))
        response = get(session, url, headers=headers, **kwargs)
        if len(calls) == 1:
            chunks = response.iter_content

            def two_chunks_then_cut(size):
                source = chunks(size)
                yield next(source)
                yield next(source)
                raise requests.ConnectionError("cut by the test")

            response.iter_content = two_chunks_then_cut
        return response

    monkeypatch.setattr(requests.Session, "get", broken_once)
    monkeypatch.setattr(mado_tracking.download.Backoff, "next_delay", lambda self, retry_after=None: 0.01)
    path = mado_tracking.download_checkpoint(saved.id, tmp_path / "step-2.tar")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == saved.sha256
    assert calls[1]["Range"] == f"bytes={2 << 20}-" and calls[1]["If-Range"] == f'"{saved.sha256}"'
    assert not (tmp_path / "step-2.tar.partial").exists()


def test_download_checkpoint_refuses_a_pending_checkpoint(mmt_env, tmp_path):
    with mado_tracking.start_run() as run:
        pending = requests.post(
            f"{mmt_env['MMT_API_URL']}/api/v1/runs/{run.id}/checkpoints/",
            json={"step": 1},
            headers={"Authorization": f"Bearer {mmt_env['MMT_API_TOKEN']}"},
            timeout=30,
        ).json()
    with pytest.raises(CheckpointError, match="is pending"):
        mado_tracking.download_checkpoint(pending["id"], tmp_path / "x.tar")


def spy_gets(monkeypatch, *, strip_range=False, cut_call=None):
    """Record the headers of every GET; ``strip_range``: a server that ignores ``Range`` (answers 200);
    ``cut_call``: that call's answer breaks before its first byte."""
    calls, get, lock = [], requests.Session.get, threading.Lock()

    def spy(session, url, headers=None, **kwargs):
        with lock:  # parts are fetched on several threads
            calls.append(dict(headers or {}))
            number = len(calls)
        sent = {} if strip_range else headers
        response = get(session, url, headers=sent, **kwargs)
        if number == cut_call:

            def cut(size):
                raise requests.ConnectionError("cut by the test")
                yield  # noqa: PLW0101 - unreachable, makes cut() a generator

            response.iter_content = cut
        return response

    monkeypatch.setattr(requests.Session, "get", spy)
    monkeypatch.setattr(mado_tracking.download.Backoff, "next_delay", lambda self, retry_after=None: 0.01)
    return calls


def test_a_large_checkpoint_downloads_as_parallel_ranged_gets_in_order(mmt_env, ckpt, tmp_path, monkeypatch):
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(ckpt, step=2)
    monkeypatch.setattr(mado_tracking.download, "PART_BYTES", 1 << 20)
    monkeypatch.setenv("MMT_DOWNLOAD_PARALLEL", "3")
    calls = spy_gets(monkeypatch, cut_call=3)  # one part breaks and is fetched again
    path = mado_tracking.download_checkpoint(saved.id, tmp_path / "step-2.tar")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == saved.sha256
    parts = -(-saved.tar_size // (1 << 20))
    expected = {f"bytes={i << 20}-{min((i + 1) << 20, saved.tar_size) - 1}" for i in range(parts - 1)}
    expected.add(f"bytes={(parts - 1) << 20}-")
    assert {call["Range"] for call in calls} == expected and len(calls) == parts + 1
    assert all(call["If-Range"] == f'"{saved.sha256}"' for call in calls)


def test_a_server_that_ignores_ranges_still_gives_the_tar_in_one_answer(mmt_env, ckpt, tmp_path, monkeypatch):
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(ckpt, step=2)
    monkeypatch.setattr(mado_tracking.download, "PART_BYTES", 1 << 20)
    monkeypatch.setenv("MMT_DOWNLOAD_PARALLEL", "3")
    calls = spy_gets(monkeypatch, strip_range=True)
    path = mado_tracking.download_checkpoint(saved.id, tmp_path / "step-2.tar")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == saved.sha256
    assert len(calls) == 2  # the first part's answer (200, cut after the part), then the rest from one answer


def test_a_bad_download_parallelism_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("MMT_DOWNLOAD_PARALLEL", "0")
    with pytest.raises(ValueError, match="MMT_DOWNLOAD_PARALLEL"):
        mado_tracking.download.download_parallel()


def test_downloads_are_parallel_from_another_machine_and_one_stream_over_loopback(monkeypatch):
    monkeypatch.delenv("MMT_DOWNLOAD_PARALLEL", raising=False)
    assert mado_tracking.download.download_parallel("https://mado.example.com/api/v1/") == 4
    assert mado_tracking.download.download_parallel("http://127.0.0.1:8000/api/v1/") == 1
    assert mado_tracking.download.download_parallel("http://localhost/api/v1/") == 1
    monkeypatch.setenv("MMT_DOWNLOAD_PARALLEL", "2")
    assert mado_tracking.download.download_parallel("http://127.0.0.1:8000/api/v1/") == 2
