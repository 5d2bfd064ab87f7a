"""What the per-bucket metric rollup costs the write path (docs/design/resume.md#steps-continue;
docs/design/interfaces.md#workspace): prints figures, asserts nothing.

Stores ``--batches`` batches of ``--keys`` keys x ``--steps`` consecutive
steps (10 x 1,000 = 10,000 points by default, a dense SDK flush: the case
with the most rollup rows per batch) through ``metrics_ingest`` on
PostgreSQL under cProfile, and prints the CPU-profiled milliseconds per batch
of the whole call and of its parts: the summary upsert, the rollup (numpy
grouping and upsert) and the binary COPY of the points. cProfile's figures
are inflated alike for every part; compare the parts with each other. The
same-run reference and the load average say how busy the machine was.

    .venv/bin/python benchmarks/rollup_ingest.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench_rollup
"""

import argparse
import cProfile
import os
import pstats
import sys
from pathlib import Path

from pages import recreate_postgres_database, reference_ms

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("metrics_ingest", "summary_add", "rollup_add", "batch_rollups", "_insert")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="PostgreSQL URL; the database is dropped and made anew")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    recreate_postgres_database(args.database_url)
    os.environ["MADO_DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from runs.metrics import metrics_ingest
    from runs.resume import run_start
    from runs.services import project_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="pw-bench")
    project = project_create(user=user, name="Bench", slug="bench")
    run = run_start(actor=user, project=project, external_id="ingest", resume="allow", host="h", pid=1).run
    keys = [f"k{i}" for i in range(args.keys)]

    def batch(number: int) -> dict:
        steps = range(number * args.steps, (number + 1) * args.steps)
        return {
            "keys": [k for _s in steps for k in keys],
            "steps": [s for s in steps for _k in keys],
            "values": [(s % 97) / 7 for s in steps for _k in keys],
        }

    batches = [batch(n) for n in range(args.batches + 1)]
    metrics_ingest(actor=user, run=run, columns=batches[0])  # warm-up: connection, statement caches
    profile = cProfile.Profile()
    profile.enable()
    for body in batches[1:]:
        metrics_ingest(actor=user, run=run, columns=body)
    profile.disable()
    stats = pstats.Stats(profile).stats
    print(
        f"reference: SHA-256 of 64 MiB in {reference_ms():.0f} ms; load average {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} CPUs (a shared machine)"
    )
    print(f"{args.batches} batches of {args.keys} keys x {args.steps} steps = {args.keys * args.steps:,} points each")
    for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in sorted(stats.items()):
        if function in PARTS and filename.startswith(str(ROOT / "runs")):
            print(f"{function:16s} {cumulative / args.batches * 1000:8.2f} ms per batch (cumulative, cProfile)")


if __name__ == "__main__":
    main()
