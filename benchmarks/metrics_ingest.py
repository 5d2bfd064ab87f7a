"""Metric ingestion and history-read benchmark (issue 2): prints figures, asserts nothing.

Starts gunicorn (2 workers) on a fresh database, logs ``--points`` points
through the SDK (two keys per ``log_metrics`` call), then reads one key's
history (``--points / 2`` points) back in one page. Prints points/s, the
history read time, the per-call latency of ``log_metrics`` (the training
loop's cost) and the peak resident memory of the server processes.

    .venv/bin/python benchmarks/metrics_ingest.py                      # SQLite under a temp dir
    .venv/bin/python benchmarks/metrics_ingest.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def recreate_postgres_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def prepare(env: dict) -> str:
    """Migrate and create the bench user and project; return the user's API token."""
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], env=env, check=True, cwd=ROOT)
    script = (
        "from django.contrib.auth import get_user_model; from runs.services import project_create;"
        "from rest_framework.authtoken.models import Token;"
        "u=get_user_model().objects.create_user('bench');project_create(user=u, name='Bench', slug='bench');"
        "print(Token.objects.create(user=u).key)"
    )
    out = subprocess.run([*manage, "shell", "-c", script], env=env, check=True, cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def peak_rss_mib(pids: list[int]) -> float:
    """Largest VmHWM (peak resident set) among ``pids``, MiB."""
    peak = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            continue
    return peak / 1024


def server_pids(master: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(master)], capture_output=True, text=True).stdout
    return [master, *(int(p) for p in out.split())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="PostgreSQL URL (the database is dropped and recreated); default SQLite")
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="mado-bench-")
    env = {**os.environ, "MADO_DATA_DIR": data_dir}
    if args.database_url:
        recreate_postgres_database(args.database_url)
        env["MADO_DATABASE_URL"] = args.database_url
    token = prepare(env)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "mado.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(args.workers), "--log-level", "warning"],
        env=env, cwd=ROOT,
    )
    try:
        for _ in range(100):
            try:
                requests.get(f"{url}/accounts/login/", timeout=5)
                break
            except requests.RequestException:
                time.sleep(0.2)
        run_benchmark(url, token, args.points, server.pid, "PostgreSQL" if args.database_url else "SQLite")
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_benchmark(url: str, token: str, points: int, server_pid: int, backend: str) -> None:
    import mado_tracking

    calls = points // 2
    latencies = []
    run = mado_tracking.start_run(project="bench", name="ingest", api_url=url, api_token=token)
    started = time.perf_counter()
    for step in range(calls):
        t0 = time.perf_counter()
        run.log_metrics({"a": 1.0 / (step + 1), "b": float(step)}, step=step)
        latencies.append(time.perf_counter() - t0)
    logged = time.perf_counter()
    run.finish()
    flushed = time.perf_counter()

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    reads = []
    for _ in range(5):
        t0 = time.perf_counter()
        response = session.get(f"{url}/api/v1/runs/{run.id}/metrics/", params={"key": "a", "page_size": calls})
        body = response.json()
        reads.append(time.perf_counter() - t0)
        assert response.status_code == 200 and len(body["results"]) == calls, (response.status_code, body.get("count"))

    latencies.sort()
    print(f"backend: {backend}")
    print(f"points logged: {calls * 2:,} in {calls:,} log_metrics calls")
    print(f"ingestion: {calls * 2 / (flushed - started):,.0f} points/s (first call to fully flushed, {flushed - started:.2f} s)")
    print(f"log_metrics call: p50 {latencies[len(latencies) // 2] * 1e6:.1f} us, "
          f"p99 {latencies[int(len(latencies) * 0.99)] * 1e6:.1f} us, max {latencies[-1] * 1e3:.2f} ms "
          f"(loop took {logged - started:.2f} s)")
    print(f"history read of {calls:,} points: median {statistics.median(reads):.3f} s, best {min(reads):.3f} s")
    print(f"server peak RSS (largest process): {peak_rss_mib(server_pids(server_pid)):.0f} MiB")


if __name__ == "__main__":
    main()
