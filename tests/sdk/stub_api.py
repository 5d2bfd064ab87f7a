"""A stand-in for the mado API on a stdlib ``http.server``, for SDK behaviour the real server cannot stage.

It answers the three calls a Run makes (create, metrics, status) and can be
told to fail the first metric posts with a given status (503: the server is
briefly unavailable) or to refuse them with a 400 body naming a field.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler with JSON helpers: ``_send`` raw bytes, ``_answer`` a JSON object, ``_body``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode())

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")


class HttpStub:
    """A stdlib HTTP server on a free loopback port, served from a daemon thread while the ``with`` block runs.

    Subclasses build their request handler class in ``_handler()``; ``url`` is the server root.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class StubApi(HttpStub):
    """Records what it receives: ``runs`` (create bodies), ``posts`` (status answered per metric post),
        ``batch_sizes`` (points per metric post), ``points`` (stored points, in arrival order) and
        ``statuses`` (PATCHed statuses), ``batch_keys`` (the ``Idempotency-Key`` of each metric post).
    ``restore_reports`` (bodies of ``POST runs/1/restore-report/``; answered 404 when ``refuse_reports``) and
        ``events`` (``"metrics"`` / ``"restore-report"`` in arrival order).
    While ``release`` is clear, metric posts hang; each takes ``metrics_delay_s`` at least; ``most_in_flight`` is the
        most metric posts seen at once.
        ``lose_create_answers``: that many run creations are stored but answered 503 (the answer got lost)."""

    def __init__(
        self,
        *,
        fail_metrics: int = 0,
        fail_status: int = 503,
        refuse: dict | None = None,
        lose_create_answers: int = 0,
        metrics_delay_s: float = 0.0,
    ):
        self.fail_metrics = fail_metrics
        self.lose_create_answers = lose_create_answers
        self.fail_status = fail_status
        self.refuse = refuse
        self.release = threading.Event()
        self.release.set()
        self.runs, self.posts, self.points, self.statuses, self.batch_sizes = [], [], [], [], []
        self.batch_keys = []
        self.restore_reports, self.events, self.refuse_reports = [], [], False
        self.in_flight = self.most_in_flight = 0
        self.metrics_delay_s = metrics_delay_s
        super().__init__()

    def __exit__(self, *exc):
        self.release.set()
        super().__exit__(*exc)

    def _metrics(self, body: dict, key: str | None) -> tuple[int, dict]:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.release.wait(30)
        time.sleep(self.metrics_delay_s)
        with self.lock:
            self.in_flight -= 1
        if "keys" in body:  # the columnar form the SDK sends, as the rows the tests compare
            body = {
                "points": [
                    {"key": k, "step": s, "value": v, "timestamp": t}
                    for k, s, v, t in zip(body["keys"], body["steps"], body["values"], body["timestamps"], strict=True)
                ]
            }
        with self.lock:
            self.batch_keys.append(key)
            self.events.append("metrics")
            self.batch_sizes.append(len(body["points"]))
            if self.fail_metrics > 0:
                self.fail_metrics -= 1
                self.posts.append(self.fail_status)
                return self.fail_status, {"error": "unavailable", "detail": "try again", "field": None}
            if self.refuse is not None:
                refuse, self.refuse = self.refuse, None
                self.posts.append(400)
                return 400, refuse
            self.posts.append(201)
            self.points.extend(body["points"])
            return 201, {"stored": len(body["points"])}

    def _handler(self):
        stub = self

        class Handler(JsonHandler):
            def _run(self, body: dict, status: str = "running") -> dict:
                return {
                    "id": 1,
                    "external_id": body.get("external_id", "stubrun1"),
                    "project": body.get("project"),
                    "name": body.get("name", ""),
                    "kind": body.get("kind", "training"),
                    "status": status,
                    "parameters": body.get("parameters", {}),
                    "url": f"{stub.url}/runs/1/",
                }

            def do_POST(self):
                body = self._body()
                if self.headers.get("Authorization") != "Bearer stub-token":
                    return self._answer(401, {"error": "unauthenticated", "detail": "bad token", "field": None})
                if self.path == "/api/v1/runs/":
                    if any(run["external_id"] == body.get("external_id") for run in stub.runs):
                        taken = {"error": "conflict", "detail": "run id taken", "field": "external_id"}
                        return self._answer(409, taken)
                    stub.runs.append(body)
                    if stub.lose_create_answers > 0:
                        stub.lose_create_answers -= 1
                        return self._answer(503, {"error": "unavailable", "detail": "lost", "field": None})
                    return self._answer(201, self._run(body))
                if self.path == "/api/v1/runs/1/metrics/":
                    return self._answer(*stub._metrics(body, self.headers.get("Idempotency-Key")))
                if self.path == "/api/v1/runs/1/restore-report/" and not stub.refuse_reports:
                    with stub.lock:
                        stub.restore_reports.append(body)
                        stub.events.append("restore-report")
                    return self._answer(201, body)
                self._answer(404, {"error": "not_found", "detail": self.path, "field": None})

            def do_GET(self):
                if self.path.startswith("/api/v1/runs/?"):
                    runs = [self._run(run) for run in reversed(stub.runs)]
                    return self._answer(200, {"count": len(runs), "next": None, "previous": None, "results": runs})
                self._answer(404, {"error": "not_found", "detail": self.path, "field": None})

            def do_PATCH(self):
                body = self._body()
                stub.statuses.append(body["status"])
                self._answer(200, self._run(stub.runs[-1] if stub.runs else {}, body["status"]))

        return Handler
