"""CPU time of one 10,000-point metrics batch, split by side: prints figures, asserts nothing.

Wall clock on a shared machine measures the neighbours; CPU time does not
(much). In one process against a fresh database this sends ``--batches``
columnar batches of ``--size`` points (two keys, as the SDK's benchmark
writer logs) through the whole Django stack (middleware, token
authentication, the view, ``metrics_ingest``), exactly as gunicorn hands a
request to ``config.wsgi.application``, and prints per batch:

- the SDK's side (``metric_points`` per ``log_metrics`` call of two keys + the columnar body);
- the web process's CPU (``time.process_time``) for the whole request;
- the PostgreSQL backend's CPU (``/proc/<backend pid>/stat``; the database
  must run on this machine) for the same requests;
- with ``--profile``, the 25 costliest functions of the web side (cProfile);
- with ``--alert-rules N``, N alert rules on the batch's keys (non-finite, above and below a threshold for 3
  points in a row, stalled loop, in turn) and the CPU their evaluation took (``alerts.receivers.alerts_on_metrics``,
  timed in place) per batch and as a share of the rest of the web request (docs/design/alerts.md#metric-rules).

The machine's load and a sha256 rate are printed beside the figures.

    .venv/bin/python benchmarks/metrics_batch_cpu.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench
"""

import argparse
import cProfile
import os
import pstats
import secrets
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "sdk"))

from metrics_ingest import load, recreate_postgres_database  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="PostgreSQL URL (dropped and recreated)")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--size", type=int, default=10_000, help="points per batch")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the web side")
    parser.add_argument("--alert-rules", type=int, default=0, help="alert rules on the batch's keys")
    args = parser.parse_args()

    recreate_postgres_database(args.database_url)
    os.environ.update(
        MADO_DATABASE_URL=args.database_url,
        MADO_DATA_DIR=tempfile.mkdtemp(prefix="mado-cpu-"),
        MADO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_SETTINGS_MODULE="config.settings",
        MADO_ALLOWED_HOSTS="testserver",
    )
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from mado.tokens import api_token_create
    from mado_tracking.metrics import batch_body
    from mado_tracking.points import metric_points
    from runs.models import Run
    from runs.services import project_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    project = project_create(user=user, name="Bench", slug="bench")
    run = Run.objects.create(project=project, name="cpu", created_by=user)
    token = api_token_create(user=user, name="benchmark")[1]
    alert_cpu = add_alert_rules(project, user, args.alert_rules) if args.alert_rules else None
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    path = f"/api/v1/runs/{run.pk}/metrics/"

    def body(batch: int) -> bytes:
        now, base = time.time(), batch * args.size // 2
        points = [
            point
            for step in range(base, base + args.size // 2)
            for point in metric_points({"a": 1.0 / (step + 1), "b": float(step)}, step, now)
        ]
        return batch_body(points)

    started = time.process_time()
    bodies = [body(n) for n in range(args.batches + 5)]
    encode_ms = (time.process_time() - started) / len(bodies) * 1e3
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

    def post(raw: bytes) -> None:
        response = client.post(path, raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
        assert response.status_code == 201, response.content

    for raw in bodies[:5]:  # warm up: imports, caches, the first pages of the index
        post(raw)
    print(f"load before: {load()}")
    profiler = cProfile.Profile() if args.profile else None
    web, db = time.process_time(), backend_cpu_s(backend)
    if profiler:
        profiler.enable()
    for raw in bodies[5:]:
        post(raw)
    if profiler:
        profiler.disable()
    web, db = time.process_time() - web, backend_cpu_s(backend) - db
    print(f"load after: {load()}")
    print(
        f"per {args.size:,}-point batch ({args.batches} batches, PostgreSQL): SDK side {encode_ms:.1f} ms CPU; "
        f"web request {web / args.batches * 1e3:.1f} ms CPU{' (profiled)' if profiler else ''}; "
        f"PostgreSQL backend {db / args.batches * 1e3:.1f} ms CPU"
    )
    if alert_cpu is not None:
        rules_ms = alert_cpu[0] / alert_cpu[1] * 1e3
        rest_ms = web / args.batches * 1e3 - rules_ms
        print(
            f"{args.alert_rules} alert rules: {rules_ms:.2f} ms CPU per batch "
            f"= {rules_ms / rest_ms * 100:.1f} % of the rest of the web request ({rest_ms:.1f} ms)"
        )
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def add_alert_rules(project, user, count: int) -> list[float]:
    """``count`` alert rules of ``project`` on keys a and b; returns ``[CPU s, calls]`` of their evaluation, counted
    from the next batch on (the metrics_stored receiver is wrapped in place)."""
    from alerts import receivers
    from alerts.services.rules import rule_create
    from runs import hooks

    shapes = [
        {"event": "metric_nonfinite"},
        {"event": "metric_above", "threshold": 1e9, "consecutive": 3},
        {"event": "metric_below", "threshold": -1e9, "consecutive": 3},
        {"event": "metric_stalled", "stalled_minutes": 30},
    ]
    for n in range(count):
        shape = shapes[n % len(shapes)]
        rule_create(actor=user, project=project, name=f"rule {n}", personal=False, key="ab"[n % 2], **shape)
    spent = [0.0, 0]
    original = receivers.alerts_on_metrics

    profile = cProfile.Profile() if os.environ.get("ALERT_PROFILE") else None

    def timed(sender, **kwargs):
        started = time.process_time()
        if profile:
            profile.enable()
        original(sender, **kwargs)
        if profile:
            profile.disable()
        spent[0] += time.process_time() - started
        spent[1] += 1
        if profile and spent[1] == 30:
            pstats.Stats(profile).sort_stats("cumtime").print_stats(30)

    hooks.metrics_stored.disconnect(dispatch_uid="alerts.metrics_stored")
    hooks.metrics_stored.connect(timed, dispatch_uid="alerts.metrics_stored", weak=False)
    return spent


if __name__ == "__main__":
    main()
