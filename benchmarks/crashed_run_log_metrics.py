"""Time of one ``log_metrics`` call on a live Run and on a Run the server ended ``crashed``
(docs/design/runs.md#liveness): prints figures, asserts nothing.

A stand-in server on a loopback port answers the calls a Run makes; for the crashed Run it answers every
metrics post and heartbeat with 409 ``run_ended``, as the real server does once the reaper marked the Run
crashed. Each Run then gets ``--calls`` ``log_metrics`` calls of two keys, timed on the training thread
(median and 99th percentile of batches of 100 calls, per call). For comparison, the disk write the SDK made on
the training thread before points of a crashed Run were buffered (one append and one ``fsync`` per call; it
also logged a warning per call, not counted here) is timed too.
The kept points go to a temporary ``MMT_CACHE_DIR``, so the disk is the one ``$TMPDIR`` is on.

    .venv/bin/python benchmarks/crashed_run_log_metrics.py --calls 20000
"""

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sdk"))

import mado_tracking  # noqa: E402
from mado_tracking import unsent  # noqa: E402


class Server:
    """``crashed``: metrics and heartbeats answer 409 ``run_ended``."""

    def __init__(self):
        self.crashed = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _run(self):
                return {"id": 1, "external_id": "bench", "project": "bench", "status": "running", "fencing_token": 1}

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/api/v1/runs/":
                    return self._answer(201, self._run())
                if server.crashed:
                    return self._answer(409, {"error": "run_ended", "detail": "run ended as crashed", "field": None})
                self._answer(201, {"stored": 0})

            def do_PATCH(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(200, self._run())

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_port}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


def timed(call, calls: int) -> tuple[float, float]:
    """Median and 99th percentile, in µs per call, of ``calls`` calls timed in batches of 100."""
    per_call = []
    for start in range(0, calls, 100):
        began = time.perf_counter()
        for step in range(start, start + 100):
            call(step)
        per_call.append((time.perf_counter() - began) / 100 * 1e6)
    return statistics.median(per_call), statistics.quantiles(per_call, n=100)[98]


def run_figures(server: Server, calls: int, crashed: bool) -> tuple[float, float]:
    server.crashed = False
    run = mado_tracking.start_run(project="bench", api_url=server.url, api_token="t", id=f"bench-{crashed}")
    if crashed:
        server.crashed = True
        run.log_metrics({"loss": 0.0}, step=0)
        run._sender._wake.set()
        while not run.lost:
            time.sleep(0.01)
    figures = timed(lambda step: run.log_metrics({"loss": 1.0 / (step + 1), "accuracy": 0.5}, step=step + 1), calls)
    run.finish()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="log_metrics calls per Run (default 20,000)")
    args = parser.parse_args()
    logging.getLogger("mado_tracking").setLevel(logging.CRITICAL)  # the crashed Run's one error and warning
    with tempfile.TemporaryDirectory(prefix="mado-bench-") as scratch:
        os.environ["MMT_CACHE_DIR"] = scratch
        server = Server()
        live = run_figures(server, args.calls, crashed=False)
        crashed = run_figures(server, args.calls, crashed=True)
        before_dir = Path(scratch) / "before"
        before = timed(
            lambda step: unsent.keep(
                before_dir, [("loss", 1.0, step, 0.0), ("accuracy", 0.5, step, 0.0)], run_label="b"
            ),
            min(args.calls, 5_000),
        )
        print(f"log_metrics, 2 keys, {args.calls} calls a Run: median / p99 per call, µs")
        print(f"  live run                                     {live[0]:8.1f} / {live[1]:8.1f}")
        print(f"  crashed run: buffered, written by a thread   {crashed[0]:8.1f} / {crashed[1]:8.1f}")
        print(
            f"  crashed run as before: append + fsync a call {before[0]:8.1f} / {before[1]:8.1f} (warning not counted)"
        )


if __name__ == "__main__":
    main()
