"""Workspace pages at scale (docs/design/interfaces.md#workspace): prints figures, asserts nothing.

Builds, on PostgreSQL, a project with ``--runs`` runs (default 10,000), each
with varying parameters and ``--keys`` metric keys (default 50) of
``--points-per-key`` points, plus one run with ``--big`` points (default
1,000,000) on one key — all with ``generate_series`` in SQL, so the build
takes seconds, not an hour of API calls. Then times, in-process through
Django's test client (no network), the median of ``--repeat`` requests of:
the runs table's first page (default columns), the same sorted by a metric,
a filter by parameters, a search by name, Compare of 20 and 50 runs, the big
run's page (also with Django's cache emptied
before each request: a first view), its charts partial (what a live page
reloads every 5 s) and the history API with ``max_points=2000`` (time and
bytes, target 100 KB; its default ``shape=columns``, and ``shape=points`` for comparison). The targets of the workspace
issue are printed next to each figure. A same-run reference (hashing 64 MiB with SHA-256) and the load average say
how busy the machine was.

    .venv/bin/python benchmarks/pages.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench_pages
    .venv/bin/python benchmarks/pages.py --database-url … --runs 100000 --keys 100 --big 10000000
"""

import argparse
import gc
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS_MS = {
    "runs table, first page": 300,
    "runs table sorted by a metric": 300,
    "runs table filtered by a parameter": 300,
    "runs table searched by name": 300,
    "compare 20 runs": 500,
    "compare 50 runs": 300,
    "run page (big key)": 300,
    "run page, first view": 300,
    "charts partial (big key)": 100,
    "history max_points=2000": 100,
    "history max_points=2000 shape=points": 100,
}


def recreate_postgres_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def build(args) -> tuple:
    """Migrate, then create the user, project, runs and points in SQL; returns ``(user, project, big_run)``."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Sum

    from runs.models import MetricChunk, Run
    from runs.services import project_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="pw-bench")
    project = project_create(user=user, name="Bench", slug="bench")
    started = time.perf_counter()
    runs, chunks = Run._meta.db_table, MetricChunk._meta.db_table
    columns = '(run_id, key, first_step, last_step, count, steps, "values", timestamps)'
    arrays = "min(s), max(s), count(*), array_agg(s ORDER BY s), array_agg(v ORDER BY s), array_agg(t ORDER BY s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {runs} (project_id, external_id, name, kind, status, created_by_id, parameters, created_at,
                                started_at, lease_token, writer_host, resume_count, step_floor, dropped_points,
                                ended_reason, job_ended, ran_as_job)
            SELECT %s, 'r' || i, 'run-' || i, 'training', CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'finished' END,
                   %s, jsonb_build_object('lr', 10 ^ -(1 + i %% 4), 'batch_size', 32 * (1 + i %% 3),
                                          'optimizer', CASE WHEN i %% 2 = 0 THEN 'adam' ELSE 'sgd' END, 'seed', 1),
                   now() - (i || ' seconds')::interval, now() - (i || ' seconds')::interval, 0, '', 0, 0, 0, '',
                   false, false
            FROM generate_series(1, %s) AS i
        """,
            [project.pk, user.pk, args.runs],
        )
        # As metrics_ingest stores them: one chunk per key of a 10,000-point batch, sorted by step.
        cursor.execute(
            f"""
            INSERT INTO {chunks} {columns}
            SELECT id, key, {arrays} FROM (
                SELECT r.id, 'metric_' || k AS key, s, random() + 1.0 / (s + 1) AS v,
                       (extract(epoch from now()) * 1000)::bigint + s AS t
                FROM {runs} r, generate_series(0, %s - 1) AS k, generate_series(0, %s - 1) AS s
                WHERE r.project_id = %s) AS points
            GROUP BY id, key, s / 10000 ORDER BY id, key, s / 10000
        """,
            [args.keys, args.points_per_key, project.pk],
        )
        cursor.execute(
            f"""
            INSERT INTO {runs} (project_id, external_id, name, kind, status, created_by_id, parameters, created_at,
                                started_at, lease_token, writer_host, resume_count, step_floor, dropped_points,
                                ended_reason, job_ended, ran_as_job)
            VALUES (%s, 'big', 'big-run', 'training', 'running', %s, '{{"lr": 0.001}}', now(), now(), 0, '', 0, 0, 0,
                    '', false, false)
            RETURNING id
        """,
            [project.pk, user.pk],
        )
        big = cursor.fetchone()[0]
        cursor.execute(
            f"""
            INSERT INTO {chunks} {columns}
            SELECT %s, 'train.loss', {arrays} FROM (
                SELECT s, 2.0 / (1 + s / 1000.0) + (CASE WHEN s = 777777 THEN 50 ELSE 0 END) AS v,
                       (extract(epoch from now()) * 1000)::bigint + s AS t
                FROM generate_series(0, %s - 1) AS s) AS points
            GROUP BY s / 10000 ORDER BY s / 10000
        """,
            [big, args.big],
        )
        cursor.execute(f"ANALYZE {runs}; ANALYZE {chunks}")
    summaries = _fill_summaries()
    rows = MetricChunk.objects.aggregate(points=Sum("count"))["points"]
    print(
        f"data: {args.runs} runs x {args.keys} keys x {args.points_per_key} points + 1 run x {args.big} points "
        f"= {rows:,} points; built in {time.perf_counter() - started:.1f} s{summaries}"
    )
    return user, project, Run.objects.get(pk=big)


def _fill_summaries() -> str:
    """Fill the per-run per-key metric summaries and per-bucket rollups from the chunks in SQL, as
    ``metrics_ingest`` keeps them current (the points went in by SQL): the figures the upgrades' backfills compute,
    in one pass over the points instead of a query per summary, so 10,000,000 summaries take minutes."""
    from django.db import connection

    from runs.metric_rollup import ROLLUP_STEPS
    from runs.models import MetricChunk, MetricRollup, MetricSummary

    chunks, summaries, rollups = (m._meta.db_table for m in (MetricChunk, MetricSummary, MetricRollup))
    finite = "v <> 'NaN' AND v <> 'Infinity' AND v <> '-Infinity'"
    bucket = f"s / {ROLLUP_STEPS}"
    extreme = f"""SELECT DISTINCT ON (run_id, key, {bucket}) run_id, key, {bucket} AS bucket, s, v, t
                  FROM bench_points WHERE {finite} ORDER BY run_id, key, s / {ROLLUP_STEPS}, v {{}}, s"""
    times = []
    with connection.cursor() as cursor:
        started = time.perf_counter()
        cursor.execute(
            f"""CREATE TEMP TABLE bench_points AS SELECT c.run_id, c.key, u.s, u.v, u.t
                FROM {chunks} c, unnest(c.steps, c."values", c.timestamps) AS u(s, v, t)"""
        )
        cursor.execute(
            f"""INSERT INTO {summaries} (run_id, key, count, first_step, last_step, last_value, min_value, max_value,
                                         first_timestamp, last_timestamp)
                SELECT run_id, key, count(*), min(s), max(s), (array_agg(v ORDER BY s DESC))[1],
                       min(v) FILTER (WHERE {finite}), max(v) FILTER (WHERE {finite}),
                       (array_agg(t ORDER BY s))[1], (array_agg(t ORDER BY s DESC))[1]
                FROM bench_points GROUP BY run_id, key"""
        )
        times.append(time.perf_counter() - started)
        started = time.perf_counter()
        cursor.execute(
            f"""INSERT INTO {rollups} (run_id, key, bucket, count, non_finite, min_step, min_value, min_timestamp,
                                       max_step, max_value, max_timestamp)
                SELECT g.run_id, g.key, g.bucket, g.n, g.n - g.finite, lo.s, lo.v, lo.t, hi.s, hi.v, hi.t
                FROM (SELECT run_id, key, s / {ROLLUP_STEPS} AS bucket, count(*) AS n,
                             count(*) FILTER (WHERE {finite}) AS finite
                      FROM bench_points GROUP BY 1, 2, 3) AS g
                LEFT JOIN ({extreme.format("ASC")}) AS lo USING (run_id, key, bucket)
                LEFT JOIN ({extreme.format("DESC")}) AS hi USING (run_id, key, bucket)"""
        )
        cursor.execute("DROP TABLE bench_points")
        times.append(time.perf_counter() - started)
        # What autovacuum does within a minute of a bulk insert: statistics, and the visibility map that lets the
        # table sorted by a metric read its summaries index-only (without it the timing is of a cold heap).
        cursor.execute("VACUUM (ANALYZE)")
    return f"; summaries filled in {times[0]:.1f} s, rollups in {times[1]:.1f} s"


def timed(client, url: str, repeat: int, cold: bool = False) -> tuple[float, int, int]:
    """Median milliseconds of ``repeat`` GETs of ``url`` (after one warm-up), the body's bytes and status;
    ``cold``: Django's cache is emptied before each (a first view, nothing remembered)."""
    from django.core.cache import cache

    response = client.get(url)
    times = []
    for _ in range(repeat):
        if cold:
            cache.clear()
        started = time.perf_counter()
        response = client.get(url)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), len(body), response.status_code


def reference_ms() -> float:
    """Hashing 64 MiB with SHA-256, ms: the machine's speed in this run."""
    data = os.urandom(64 * 2**20)
    started = time.perf_counter()
    hashlib.sha256(data).digest()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="PostgreSQL URL; the database is dropped and made anew")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--points-per-key", type=int, default=5)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="time the data an earlier run built in this database instead of building it anew",
    )
    args = parser.parse_args()
    if not args.reuse:
        recreate_postgres_database(args.database_url)
    os.environ["MADO_DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import get_resolver

    from runs.models import Run

    setup_test_environment()
    if args.reuse:
        from django.core.management import call_command

        from runs.models import Project

        call_command("migrate", verbosity=0)
        project = Project.objects.get(slug="bench")
        user, big = project.runs.get(external_id="big").created_by, project.runs.get(external_id="big")
    else:
        user, project, big = build(args)
    client = Client()
    client.force_login(user)
    # As config.wsgi does in a web process: what lives as long as the process leaves the collector's view, so a
    # full collection during a timed request walks only what requests left behind.
    get_resolver().url_patterns  # noqa: B018 - loads every view module before the freeze
    gc.collect()
    gc.freeze()
    latest = list(
        Run.objects.filter(project=project).exclude(pk=big.pk).order_by("-id").values_list("pk", flat=True)[:50]
    )
    twenty, fifty = ("&".join(f"run={pk}" for pk in latest[:count]) for count in (20, 50))
    urls = {
        "runs table, first page": f"/projects/{project.slug}/",
        "runs table sorted by a metric": f"/projects/{project.slug}/?sort=-metric:metric_7:last",
        "runs table filtered by a parameter": f"/projects/{project.slug}/?q=lr%3C0.005+and+optimizer%3Dadam",
        "runs table searched by name": f"/projects/{project.slug}/?q=run-4242",
        "compare 20 runs": f"/projects/{project.slug}/compare/?{twenty}",
        "compare 50 runs": f"/projects/{project.slug}/compare/?{fifty}",
        "run page (big key)": f"/runs/{big.pk}/",
        "run page, first view": f"/runs/{big.pk}/",
        "charts partial (big key)": f"/runs/{big.pk}/charts/",
        "history max_points=2000": f"/api/v1/runs/{big.pk}/metrics/?key=train.loss&max_points=2000",
        "history max_points=2000 shape=points": (
            f"/api/v1/runs/{big.pk}/metrics/?key=train.loss&max_points=2000&shape=points"
        ),
    }
    print(
        f"reference: SHA-256 of 64 MiB in {reference_ms():.0f} ms; load average {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} CPUs (a shared machine)"
    )
    for name, url in urls.items():
        ms, size, status = timed(client, url, args.repeat, cold=name.endswith("first view"))
        print(f"{name:32s} {ms:8.1f} ms  (target {TARGETS_MS[name]} ms)  {size / 1024:8.1f} KiB  HTTP {status}")


if __name__ == "__main__":
    main()
