"""A real Celery worker process consumes from a Redis broker with mado's Celery configuration."""

import os
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
    try:
        replies = []
        deadline = time.monotonic() + 60
        while not replies and time.monotonic() < deadline:
            assert worker.poll() is None, "the worker exited"
            replies = client.control.ping(timeout=1.0)
        assert any(name.startswith("itest@") for reply in replies for name in reply)
        queues = client.control.inspect(timeout=2.0).active_queues() or {}
        assert any(q["name"] == "gpu-test" for qs in queues.values() for q in qs)
        stats = client.control.inspect(timeout=2.0).stats() or {}
        assert all(s["prefetch_count"] == 1 for s in stats.values())
    finally:
        worker.terminate()
        worker.wait(timeout=30)
