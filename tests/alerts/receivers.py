"""Real receivers run by the tests: an HTTP server that checks mado's webhook signature, and an SMTP server."""

import hashlib
import hmac
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller

MAX_AGE_S = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def signature_ok(secret: str, header: str, body: bytes, *, now: float | None = None) -> bool:
    """What a receiver does with ``X-Mado-Signature: t=<ts>,v1=<hex>``: recompute, compare, refuse an old stamp."""
    fields = dict(part.split("=", 1) for part in header.split(","))
    timestamp = int(fields["t"])
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    fresh = abs((now or time.time()) - timestamp) <= MAX_AGE_S
    return fresh and hmac.compare_digest(expected, fields["v1"])


class WebhookReceiver:
    """An HTTP receiver on 127.0.0.1 that records each POST (``received``: headers, JSON body, signature verdict).

    ``secret`` is set once the channel exists; ``stop()`` closes the port (an outage), ``start()`` opens it again;
    ``redirect_to`` answers every POST with a 307 to that URL; a POST to ``/hop/<n>`` (``hops_url(n)``) is
    answered with a 307 to ``/hop/<n-1>`` until ``/hop/0``, which is received.
    """

    def __init__(self):
        self.port = free_port()
        self.received: list[dict] = []
        self.secret = ""
        self.redirect_to = ""
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def hops_url(self, hops: int) -> str:
        return f"http://127.0.0.1:{self.port}/hop/{hops}"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hops = int(self.path.removeprefix("/hop/")) if self.path.startswith("/hop/") else 0
                if receiver.redirect_to or hops:
                    self.send_response(307)
                    self.send_header("Location", receiver.redirect_to or f"/hop/{hops - 1}")
                    self.end_headers()
                    return
                signature = self.headers.get("X-Mado-Signature", "")
                receiver.received.append(
                    {
                        "headers": dict(self.headers),
                        "body": json.loads(body),
                        "signed": bool(signature) and signature_ok(receiver.secret, signature, body),
                    }
                )
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class SmtpReceiver:
    """An SMTP server (aiosmtpd) on 127.0.0.1 keeping each message as ``(recipients, text)``."""

    def __init__(self):
        self.messages: list[tuple[list[str], str]] = []
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                receiver.messages.append((list(envelope.rcpt_tos), envelope.content.decode("utf-8", "replace")))
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self):
        self.controller.start()
        return self

    def __exit__(self, *exc):
        self.controller.stop()
