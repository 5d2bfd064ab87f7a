"""The SDK's retry policy against a scripted stand-in server: what is retried (503, 502, 504, unreachable) and for
how long (``MMT_RETRY_TIMEOUT``), what is final (4xx, 507: the body is sent once), what a user reads (the JSON
detail, never an HTML page) and the clean-up when it gives up (its own multipart upload is aborted)."""

import json
import logging
import socket

import pytest

from mado_tracking import checkpoints, client
from mado_tracking.client import ApiClient
from mado_tracking.config import Config, retry_timeout
from mado_tracking.errors import ApiError, CheckpointError, ConfigError
from mado_tracking.tarstream import CheckpointTar
from tests.sdk.stub_api import HttpStub, JsonHandler

UNAVAILABLE = {"error": "unavailable", "detail": "database unavailable, retry", "field": None}
HTML_PAGE = b"<!doctype html><html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>"


class ScriptedApi(HttpStub):
    """Answers each ``(method, path)`` from ``script``: a list of ``(status, body[, headers])`` used in order, the
    last one repeated (``body``: a dict sent as JSON, bytes sent as an HTML page). ``requests`` records
    ``(method, path, body bytes received)``; every body is read to its end before the answer."""

    def __init__(self):
        self.script: dict[tuple[str, str], list[tuple]] = {}
        self.requests: list[tuple[str, str, int]] = []
        super().__init__()

    def calls(self, method: str, path: str) -> list[int]:
        """Body sizes (bytes) of the requests received for ``method path``."""
        return [size for m, p, size in self.requests if (m, p) == (method, path)]

    def _handler(self):
        stub = self

        class Handler(JsonHandler):
            def _scripted(self):
                length = int(self.headers.get("Content-Length") or 0)
                received = len(self.rfile.read(length)) if length else 0
                path = self.path.split("?")[0]
                with stub.lock:
                    stub.requests.append((self.command, path, received))
                    answers = stub.script.get((self.command, path)) or [(404, {"error": "not_found", "detail": path})]
                    status, body, *headers = answers.pop(0) if len(answers) > 1 else answers[0]
                self.send_response(status)
                for name, value in (headers[0] if headers else {}).items():
                    self.send_header(name, value)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_header("Content-Type", "text/html" if isinstance(body, bytes) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _scripted

        return Handler


@pytest.fixture
def api():
    with ScriptedApi() as stub:
        yield stub


@pytest.fixture(autouse=True)
def _quick_backoff(monkeypatch):
    monkeypatch.setattr(checkpoints, "BACKOFF_BASE_S", 0.01)
    monkeypatch.setattr(checkpoints, "BACKOFF_CAP_S", 0.05)


def api_client(stub) -> ApiClient:
    return ApiClient(Config(api_url=stub.url, api_token="stub-token"))


@pytest.fixture
def ckpt(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "model.pt").write_bytes(b"w" * 300_000)
    return directory


def register_answer(direct_upload: bool) -> tuple:
    return (201, {"id": 7, "step": 3, "state": "pending", "direct_upload": direct_upload})


def test_a_4xx_is_final_and_sent_once(api):
    api.script[("POST", "/api/v1/runs/1/metrics/")] = [
        (400, {"error": "invalid", "detail": "value must be a number", "field": "points[0].value"})
    ]
    with pytest.raises(ApiError) as raised:
        api_client(api).request("POST", "runs/1/metrics/", body={"points": [{"key": "loss", "value": "x"}]})
    assert raised.value.status == 400 and raised.value.field == "points[0].value"
    assert "value must be a number" in str(raised.value)
    assert len(api.calls("POST", "/api/v1/runs/1/metrics/")) == 1


def test_503_is_retried_until_the_server_recovers(api, monkeypatch, caplog):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "60")
    monkeypatch.setattr(client, "PROGRESS_EVERY_S", 0.0)  # every retry is "30 s later" for the progress line
    answers = [(503, UNAVAILABLE, {"Retry-After": "0"}), (502, HTML_PAGE), (504, UNAVAILABLE, {"Retry-After": "0"})]
    api.script[("GET", "/api/v1/runs/1/")] = [*answers, (200, {"id": 1, "status": "running"})]
    with caplog.at_level(logging.INFO, logger="mado_tracking"):
        answer = api_client(api).request("GET", "runs/1/")
    assert answer == {"id": 1, "status": "running"}
    assert len(api.calls("GET", "/api/v1/runs/1/")) == 4
    progress = [r.getMessage() for r in caplog.records if "still failing after" in r.getMessage()]
    assert progress and "database unavailable, retry" in progress[0]


def test_it_gives_up_once_MMT_RETRY_TIMEOUT_has_passed(api, monkeypatch):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "1")
    api.script[("GET", "/api/v1/runs/1/")] = [(503, UNAVAILABLE, {"Retry-After": "0.2"})]
    with pytest.raises(ApiError) as raised:
        api_client(api).request("GET", "runs/1/")
    message = str(raised.value)
    assert raised.value.status == 503 and "database unavailable, retry" in message
    assert "gave up after" in message and "MMT_RETRY_TIMEOUT=1" in message
    assert 2 <= len(api.calls("GET", "/api/v1/runs/1/")) <= 7  # Retry-After 0.2 s honoured within the second


def test_an_unreachable_server_is_retried_then_named(monkeypatch):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket is closed
    unreachable = ApiClient(Config(api_url=f"http://127.0.0.1:{port}", api_token="t"))
    with pytest.raises(ApiError, match=r"cannot reach the mado API .* gave up after ([2-9]|\d\d+) tries"):
        unreachable.request("GET", "runs/1/", backoff=client.Backoff(0.05, 0.1))


def test_html_error_pages_are_never_printed(api, monkeypatch):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "0")
    api.script[("GET", "/api/v1/runs/1/")] = [(502, HTML_PAGE)]
    api.script[("GET", "/api/v1/runs/2/")] = [(404, HTML_PAGE)]
    for path in ("runs/1/", "runs/2/"):
        with pytest.raises(ApiError) as raised:
            api_client(api).request("GET", path)
        assert "<" not in str(raised.value) and "nginx" not in str(raised.value)
        assert "an HTML page, not shown" in str(raised.value)


def test_507_is_final_and_the_checkpoint_body_is_sent_once(api, ckpt):
    api.script[("POST", "/api/v1/runs/1/checkpoints/")] = [register_answer(direct_upload=False)]
    full = {"error": "insufficient_storage", "detail": "no space left on the artifact storage", "field": None}
    api.script[("PUT", "/api/v1/checkpoints/7/tar")] = [(507, full)]
    with pytest.raises(CheckpointError, match="no space left on the artifact storage"):
        checkpoints.upload_checkpoint(api_client(api), run_id=1, directory=ckpt, step=3, idempotency_key="k")
    bodies = api.calls("PUT", "/api/v1/checkpoints/7/tar")
    assert len(bodies) == 1 and bodies[0] > 300_000  # the whole tar, once
    assert api.calls("POST", "/api/v1/checkpoints/7/complete/") == []


def test_a_checkpoint_upload_rides_out_503s(api, ckpt, monkeypatch):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "60")
    tar = CheckpointTar(ckpt, tar_hash=True)
    for _ in tar:  # the tar the SDK will send: its length and SHA-256, for the stub's answers
        pass
    api.script[("POST", "/api/v1/runs/1/checkpoints/")] = [register_answer(direct_upload=False)]
    unavailable = (503, {**UNAVAILABLE, "detail": "storage unavailable, retry"}, {"Retry-After": "0"})
    received = (200, {"received_bytes": len(tar), "sha256": tar.sha256})
    api.script[("PUT", "/api/v1/checkpoints/7/tar")] = [unavailable, unavailable, unavailable, received]
    complete = {"id": 7, "step": 3, "state": "complete", "tar_sha256": tar.sha256, "tar_size": len(tar)}
    api.script[("POST", "/api/v1/checkpoints/7/complete/")] = [(200, complete)]
    saved = checkpoints.upload_checkpoint(api_client(api), run_id=1, directory=ckpt, step=3, idempotency_key="k")
    assert saved.sha256 == tar.sha256
    assert api.calls("PUT", "/api/v1/checkpoints/7/tar") == [len(tar)] * 4  # re-read from the files each time


def test_giving_up_aborts_the_multipart_upload_it_started(api, ckpt, monkeypatch):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", "1")
    api.script[("POST", "/api/v1/runs/1/checkpoints/")] = [register_answer(direct_upload=True)]
    plan = {
        "upload_id": "up-1",
        "part_size": 8 << 20,
        "urls": [f"{api.url}/bucket/part1"],
        "abort_url": f"{api.url}/bucket/abort-up-1",
    }
    api.script[("POST", "/api/v1/checkpoints/7/upload-parts/")] = [(200, plan)]
    api.script[("PUT", "/bucket/part1")] = [(503, b"<Error><Code>SlowDown</Code></Error>")]
    api.script[("DELETE", "/bucket/abort-up-1")] = [(204, b"")]
    with pytest.raises(ApiError, match="gave up after"):
        checkpoints.upload_checkpoint(api_client(api), run_id=1, directory=ckpt, step=3, idempotency_key="k")
    assert len(api.calls("PUT", "/bucket/part1")) >= 2
    assert len(api.calls("DELETE", "/bucket/abort-up-1")) == 1
    assert api.calls("POST", "/api/v1/checkpoints/7/complete/") == []


def test_a_completed_direct_upload_is_not_aborted(api, ckpt):
    api.script[("POST", "/api/v1/runs/1/checkpoints/")] = [register_answer(direct_upload=True)]
    plan = {
        "upload_id": "up-1",
        "part_size": 8 << 20,
        "urls": [f"{api.url}/bucket/part1"],
        "abort_url": f"{api.url}/bucket/abort-up-1",
    }
    api.script[("POST", "/api/v1/checkpoints/7/upload-parts/")] = [(200, plan)]
    api.script[("PUT", "/bucket/part1")] = [(200, b"", {"ETag": '"e1"'})]
    verified = {"id": 7, "step": 3, "state": "complete", "tar_sha256": "ab", "tar_size": 1, "error": ""}
    api.script[("POST", "/api/v1/checkpoints/7/complete/")] = [(200, verified)]
    saved = checkpoints.upload_checkpoint(api_client(api), run_id=1, directory=ckpt, step=3, idempotency_key="k")
    assert saved.id == 7
    assert api.calls("DELETE", "/bucket/abort-up-1") == []


@pytest.mark.parametrize("value", ["soon", "-5", "inf", "nan"])
def test_a_bad_MMT_RETRY_TIMEOUT_is_named(monkeypatch, value):
    monkeypatch.setenv("MMT_RETRY_TIMEOUT", value)
    with pytest.raises(ConfigError, match="MMT_RETRY_TIMEOUT must be a number of seconds"):
        retry_timeout()
