"""A real Celery worker process consumes from a Redis broker with mado's Celery configuration."""

import os
import socket
import subprocess
import sys
import time

from celery import Celery


def test_a_worker_on_redis_answers_on_its_queue(redis_url, tmp_path):
    env = {**os.environ, "CELERY_BROKER_URL": redis_url, "MADO_DATA_DIR": str(tmp_path)}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--queues",
            "gpu-test",
            "--hostname",
            "itest@%h",
            "--concurrency",
            "1",
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
        ],
        env=env,
        start_new_session=True,
    )
    client = Celery(broker=redis_url)
    # Only this worker is asked: other tests' workers may share the broker's database (pytest-xdist).
    name = f"itest@{socket.gethostname()}"
    try:
        replies = []
        deadline = time.monotonic() + 60
        while not replies and time.monotonic() < deadline:
            assert worker.poll() is None, "the worker exited"
            replies = client.control.ping(destination=[name], timeout=1.0)
        assert [list(reply) for reply in replies] == [[name]]
        queues = client.control.inspect(destination=[name], timeout=5.0).active_queues() or {}
        assert [q["name"] for q in queues[name]] == ["gpu-test"]
        stats = client.control.inspect(destination=[name], timeout=5.0).stats() or {}
        assert stats[name]["prefetch_count"] == 1
    finally:
        worker.terminate()
        worker.wait(timeout=30)
