"""Metric ingestion and history-read benchmark: prints figures, asserts nothing.

Starts gunicorn on a fresh database in the layout of docs/deploy.md
(``gthread``; ``--workers`` x ``--threads``), then ``--writers`` processes
each log ``--points`` points to their own Run through the SDK (two keys per
``log_metrics`` call) while a reader thread reads a Run's keys and a
1,000-point history page in a loop, as a Run page refresh does. With
``--rate``, writer ``n`` of ``N`` starts ``n/N`` seconds after the first (twenty
independent jobs do not start, or finish, in the same millisecond; the
spread is the SDK's flush interval). Prints the
total points/s (first call to the last point flushed), the latency of every
metrics POST the SDK made (p50/p99), the reader's latency (p50/p99), the
per-call cost of ``log_metrics`` (the training loop's), one key's full
history read, the peak resident memory of the server processes, the
machine's load (``os.getloadavg``) and how its CPUs were spent while the
writers logged (busy, idle, and steal: time the hypervisor gave to other
guests): the figures mean little without them on a shared machine.

    .venv/bin/python benchmarks/metrics_ingest.py                      # SQLite under a temp dir
    .venv/bin/python benchmarks/metrics_ingest.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench
    .venv/bin/python benchmarks/metrics_ingest.py --database-url ... --writers 20 --points 100000
"""

import argparse
import hashlib
import multiprocessing
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
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
    """Migrate and create the bench user and project; return the user's API token.

    Also puts a fresh ``MADO_SECRET_KEY`` into ``env`` when it has none: the
    web server started with ``env`` refuses to run without one.
    """
    env.setdefault("MADO_SECRET_KEY", secrets.token_urlsafe(50))
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], env=env, check=True, cwd=ROOT)
    script = (
        "from django.contrib.auth import get_user_model; from runs.services import project_create;"
        "from mado.tokens import api_token_create;"
        "u=get_user_model().objects.create_user('bench');project_create(user=u, name='Bench', slug='bench');"
        "print(api_token_create(user=u, name='benchmark')[1])"
    )
    out = subprocess.run(
        [*manage, "shell", "-c", script], env=env, check=True, cwd=ROOT, capture_output=True, text=True
    )
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
    parser.add_argument("--points", type=int, default=200_000, help="points per writer")
    parser.add_argument("--writers", type=int, default=1, help="processes logging at once, one Run each")
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="points/s each writer offers (0: as fast as it can); a training job logs at a pace, and "
        "writers that never pause keep a POST in flight each, so POST latency = writers / POSTs/s",
    )
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker (gthread)")
    parser.add_argument(
        "--ingest-workers",
        type=int,
        default=0,
        help="a separate ingest pool of this many workers takes the writers' requests, as the proxy "
        "of docs/deploy.md routes metrics POSTs (0: one pool serves everything)",
    )
    parser.add_argument(
        "--ingest-threads", type=int, default=None, help="threads per worker of the ingest pool (default: --threads)"
    )
    parser.add_argument(
        "--ingest-nice",
        type=int,
        default=0,
        help="run the ingest pool under nice -n N, as docs/deploy.md does, so reads win the CPU",
    )
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="mado-bench-")
    env = {**os.environ, "MADO_DATA_DIR": data_dir}
    if args.database_url:
        recreate_postgres_database(args.database_url)
        env["MADO_DATABASE_URL"] = args.database_url
    token = prepare(env)
    url, server = serve(env, args.workers, args.threads)
    ingest = None
    try:
        ingest_threads = args.ingest_threads or args.threads
        ingest_url, ingest = (
            serve(env, args.ingest_workers, ingest_threads, nice=args.ingest_nice)
            if args.ingest_workers
            else (url, None)
        )
        pools = f"gthread {args.workers} workers x {args.threads} threads"
        if ingest:
            pools += f" + ingest pool {args.ingest_workers} x {ingest_threads} (nice {args.ingest_nice})"
        print(f"backend: {'PostgreSQL' if args.database_url else 'SQLite'}; gunicorn {pools}; load before: {load()}")
        run_benchmark(url, ingest_url, token, args.points, args.writers, args.rate)
        pids = server_pids(server.pid) + (server_pids(ingest.pid) if ingest else [])
        print(f"server peak RSS (largest process): {peak_rss_mib(pids):.0f} MiB")
    finally:
        for proc in (server, ingest):
            if proc:
                proc.terminate()
                proc.wait(timeout=30)


def serve(env: dict, workers: int, threads: int, nice: int = 0) -> tuple[str, subprocess.Popen]:
    """A gunicorn (gthread) on a free port, answering, under ``nice -n nice``; its URL and process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            *(["nice", "-n", str(nice)] if nice else []),
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--worker-class",
            "gthread",
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=ROOT,
    )
    wait_for_server(url)
    return url, server


def wait_for_server(url: str) -> None:
    """Poll ``url``'s login page until the server answers (at most about 20 s)."""
    for _ in range(100):
        try:
            requests.get(f"{url}/accounts/login/", timeout=5)
            return
        except requests.RequestException:
            time.sleep(0.2)


def load() -> str:
    """The load average and a same-run CPU reference (sha256 of 64 MiB on one core): figures on a shared
    machine mean something only beside these."""
    data = b"\0" * (64 << 20)
    started = time.perf_counter()
    hashlib.sha256(data).digest()
    rate = 64 / (time.perf_counter() - started)
    return (
        " ".join(f"{figure:.2f}" for figure in os.getloadavg()) + f" ({os.cpu_count()} CPUs); sha256 {rate:.0f} MiB/s"
    )


def in_process(database_url: str | None, prefix: str):
    """Set Django up in this process against a fresh database (PostgreSQL at ``database_url``, dropped and
    recreated; None: SQLite under a temporary data directory named ``prefix``…), migrate it, print the backend and
    the load, and return a user ``bench`` and its Project ``bench``."""
    os.environ["MADO_DATA_DIR"] = tempfile.mkdtemp(prefix=prefix)
    if database_url:
        recreate_postgres_database(database_url)
        os.environ["MADO_DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from runs.services import project_create

    call_command("migrate", verbosity=0)
    print(f"backend: {'PostgreSQL' if connection.vendor == 'postgresql' else 'SQLite'}; load: {load()}")
    user = get_user_model().objects.create_user("bench")
    return user, project_create(user=user, name="Bench", slug="bench")


def cpu_ticks() -> list[int]:
    """The machine's CPU time so far, in ticks: user, nice, system, idle, iowait, irq, softirq, steal (/proc/stat)."""
    return [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def cpu_share(before: list[int], after: list[int]) -> str:
    """How the machine's CPUs spent the time between two ``cpu_ticks``: busy (user, nice, system, interrupts), idle
    and steal (taken by the hypervisor: a shared host's neighbours), in % of all CPUs."""
    user, nice, system, idle, iowait, irq, softirq, steal = (b - a for a, b in zip(before, after))
    total = max(user + nice + system + idle + iowait + irq + softirq + steal, 1)
    busy = user + nice + system + irq + softirq
    return (
        f"busy {100 * busy / total:.0f} % (nice'd {100 * nice / total:.0f} %), "
        f"idle {100 * (idle + iowait) / total:.0f} %, "
        f"steal {100 * steal / total:.0f} % of {os.cpu_count()} CPUs"
    )


def quantiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    if not ordered:
        return "none"
    return (
        f"p50 {ordered[len(ordered) // 2] * 1e3:.1f} ms, p99 {ordered[int(len(ordered) * 0.99)] * 1e3:.1f} ms, "
        f"max {ordered[-1] * 1e3:.1f} ms ({len(ordered)} requests)"
    )


def writer(
    url: str,
    ingest_url: str,
    token: str,
    points: int,
    rate: float,
    name: str,
    offset: float,
    start: multiprocessing.Event,
    out,
    done: multiprocessing.Event,
) -> None:
    """One training process: log ``points`` points through the SDK at ``rate`` points/s (0: no pause); report
    timings, POST latencies, the Run id. A paced writer starts ``offset`` seconds after the others are told to.
    It exits once ``done`` is set (every writer has reported): twenty exits (interpreter teardown, the SDK's
    exit handlers, closed connections) in the last second shared the cores with the last writers' POSTs and
    raised the POST p99 (docs/design/resume.md#steps-continue; docs/deploy.md, "Measured: the ingest benchmark's
    writers"); jobs on other machines take no server core.
    Its metrics POSTs go to ``ingest_url`` and every other request (the Run's start, heartbeats, its finish) to
    ``url``, as docs/deploy.md's proxy routes them: twenty finishes and last heartbeats landing in the ingest
    pool within the run's last second would queue the last batches behind requests that
    pool never serves."""
    import mado_tracking
    from mado_tracking.client import ApiClient

    posts = []
    send, url_of = ApiClient.send, ApiClient.url
    route = threading.local()

    def routed_url(self, path):
        full = url_of(self, path)
        return full.replace(url, ingest_url, 1) if getattr(route, "ingest", False) else full

    def timed_send(self, method, path, **kwargs):
        route.ingest = method == "POST" and path.endswith("/metrics/")
        started = time.perf_counter()
        try:
            return send(self, method, path, **kwargs)
        finally:
            if method == "POST" and path.endswith("/metrics/"):
                posts.append(time.perf_counter() - started)

    ApiClient.send, ApiClient.url = timed_send, routed_url
    run = mado_tracking.start_run(project="bench", name=name, api_url=url, api_token=token)
    calls, latencies = points // 2, []
    start.wait()
    if rate:  # independent jobs: each starts (and so ends) at its own moment within the SDK's flush interval
        time.sleep(offset)
    started = time.perf_counter()
    for step in range(calls):
        t0 = time.perf_counter()
        run.log_metrics({"a": 1.0 / (step + 1), "b": float(step)}, step=step)
        latencies.append(time.perf_counter() - t0)
        if rate and step % 500 == 0:
            ahead = started + step * 2 / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
    run.finish()
    out.put(
        {
            "run": run.id,
            "started": started,
            "flushed": time.perf_counter(),
            "posts": posts,
            "calls": latencies[:: max(len(latencies) // 10_000, 1)],
        }
    )
    done.wait()


def reader(url: str, token: str, run_id: int, stop: threading.Event, out: list) -> None:
    """A Run page refresh in a loop: the keys, then a 1,000-point history page."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    while not stop.is_set():
        started = time.perf_counter()
        session.get(f"{url}/api/v1/runs/{run_id}/metrics/").raise_for_status()
        session.get(f"{url}/api/v1/runs/{run_id}/metrics/", params={"key": "a", "page_size": 1000}).raise_for_status()
        out.append(time.perf_counter() - started)
        stop.wait(0.05)


def run_benchmark(url: str, ingest_url: str, token: str, points: int, writers: int, rate: float) -> None:
    import mado_tracking

    watched = mado_tracking.start_run(project="bench", name="watched", api_url=url, api_token=token)
    watched.log_metrics({"a": 1.0, "b": 2.0}, step=0)
    watched.finish()
    context = multiprocessing.get_context("spawn")
    start, out, done = context.Event(), context.Queue(), context.Event()
    procs = [
        context.Process(
            target=writer, args=(url, ingest_url, token, points, rate, f"w{n}", n / writers, start, out, done)
        )
        for n in range(writers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(3 + writers * 0.3)  # every writer has created its Run
    reads, stop = [], threading.Event()
    read_thread = threading.Thread(target=reader, args=(url, token, watched.id, stop, reads))
    read_thread.start()
    before = cpu_ticks()
    start.set()
    results = [out.get(timeout=3600) for _ in procs]
    machine = cpu_share(before, cpu_ticks())
    stop.set()
    done.set()
    read_thread.join()
    for proc in procs:
        proc.join()
    began, ended = min(r["started"] for r in results), max(r["flushed"] for r in results)
    total = sum(points // 2 * 2 for _ in results)
    calls = sorted(c for r in results for c in r["calls"])
    print(f"load after: {load()}")
    print(f"machine CPU while the writers logged: {machine}")
    offered = f"{rate * writers:,.0f} points/s offered" if rate else "writers never pause"
    print(
        f"ingestion ({offered}): {writers} writer(s) x {points // 2 * 2:,} points = {total:,} points "
        f"in {ended - began:.2f} s: {total / (ended - began):,.0f} points/s"
    )
    posts = [p for r in results for p in r["posts"]]
    print(
        f"metrics POST (the SDK's batches, {total / max(len(posts), 1):,.0f} points each on average): "
        f"{quantiles(posts)}"
    )
    print(f"concurrent API read (keys + 1,000-point page): {quantiles(reads)}")
    print(
        f"log_metrics call: p50 {calls[len(calls) // 2] * 1e6:.1f} us, p99 {calls[int(len(calls) * 0.99)] * 1e6:.1f} us"
    )

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    full = []
    for _ in range(3):
        t0 = time.perf_counter()
        response = session.get(
            f"{url}/api/v1/runs/{results[0]['run']}/metrics/", params={"key": "a", "page_size": points // 2}
        )
        full.append(time.perf_counter() - t0)
        assert response.status_code == 200 and len(response.json()["results"]) == points // 2
    print(f"history read of {points // 2:,} points: median {statistics.median(full):.3f} s, best {min(full):.3f} s")


if __name__ == "__main__":
    main()
