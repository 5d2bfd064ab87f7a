"""A real Celery worker process consumes from a Redis broker with mado's Celery configuration."""

import os
import socket
import subprocess
import sys
import time
import uuid

from celery import Celery


def test_a_worker_on_redis_answers_on_its_queue(redis_url, tmp_path):
    node = f"itest-{uuid.uuid4().hex[:8]}"  # no other worker, a left-over one included, answers to this name
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
            f"{node}@%h",
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
    name = f"{node}@{socket.gethostname()}"

    def ask(method: str) -> dict:
        """This worker's answer to a control command, asked again until it comes (a loaded machine answers late)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert worker.poll() is None, "the worker exited"
            answer = getattr(client.control.inspect(destination=[name], timeout=1.0), method)() or {}
            if name in answer:
                return answer[name]
        raise AssertionError(f"{name} did not answer {method} within 60 s")

    try:
        assert ask("ping") == {"ok": "pong"}
        assert [q["name"] for q in ask("active_queues")] == ["gpu-test"]
        assert ask("stats")["prefetch_count"] == 1
    finally:
        worker.terminate()
        worker.wait(timeout=30)
