"""What keeping a resumed Run's parity verdict current costs (docs/design/resume.md#parity): prints figures, asserts
nothing.

In one process against a fresh PostgreSQL database (on this machine: the backend's CPU is read from ``/proc``, to
the nanosecond), a parent Run logs ``--parent-points`` points (two keys, ``--batch`` points per request, through the
whole Django stack as gunicorn hands a request to it), "fails", and a child resumed from its checkpoint ``--overlap``
steps before the parent's last step logs on. Printed:

1. the batch's cost today: web-process and backend CPU of one ``--batch``-point metrics POST of the resumed child past
   the overlap with the parity receiver disconnected (what the ingest costs without parity), beside the same with it
   connected (pairs in random order; their difference is mostly the noise of a shared machine);
2. the extra per batch: the receiver's own web and backend CPU measured inside those requests, plus building the
   event's payload from a batch, as a share of 1; and the receiver alone (``--calls`` calls) for a Run that is no
   resumed Run's parent or child;
3. the verdict of the 1,000,000-point parent: the child's first batch covers the whole overlap, and the verdict read
   right after it (compared steps, verdict) with that batch's cost; then a second child logging SDK-sized batches
   (``--small`` steps each): after which batch the verdict covers the whole overlap.

    .venv/bin/python benchmarks/parity.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench
"""

import argparse
import os
import random
import secrets
import statistics
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

KEYS = ("train.loss", "train.accuracy")


def backend_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` ran so far, to the nanosecond (``/proc/<pid>/schedstat``; ``/proc/<pid>/stat``
    counts 10 ms ticks, coarser than the difference measured here)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def columns(first: int, steps: int) -> dict:
    """Two keys at ``steps`` steps from ``first``: the same values whichever Run logs them."""
    body = {"keys": [], "steps": [], "values": []}
    for step in range(first, first + steps):
        body["keys"] += KEYS
        body["steps"] += [step, step]
        body["values"] += [1.0 / (step + 1), (step % 977) / 977.0]
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="PostgreSQL URL (dropped and recreated)")
    parser.add_argument("--parent-points", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000, help="points per metrics POST")
    parser.add_argument("--overlap", type=int, default=1_000, help="steps the parent logged after its checkpoint")
    parser.add_argument("--batches", type=int, default=40, help="child batches past the overlap, per arm")
    parser.add_argument("--calls", type=int, default=2_000, help="receiver calls timed alone")
    parser.add_argument("--small", type=int, default=50, help="steps per batch of the SDK-sized child")
    args = parser.parse_args()

    recreate_postgres_database(args.database_url)
    os.environ.update(
        MADO_DATABASE_URL=args.database_url,
        MADO_DATA_DIR=tempfile.mkdtemp(prefix="mado-parity-"),
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

    from checkpoints.models import Checkpoint, CheckpointState
    from mado.tokens import api_token_create
    from parity import receivers
    from parity.models import Parity
    from parity.receivers import parity_follows_metrics
    from parity.services import parity_after_batch
    from runs import hooks
    from runs.metric_batch import columns_from_columnar, sort_by_key
    from runs.models import Run, RunStatus
    from runs.services import project_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    project = project_create(user=user, name="Bench", slug="bench")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_token_create(user=user, name='benchmark')[1]}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    per_batch = args.batch // len(KEYS)

    def post(run, body: dict) -> tuple[float, float]:
        """POST one batch; its (web, backend) CPU seconds."""
        import json

        raw = json.dumps(body).encode()
        web, db = time.process_time(), backend_cpu_s(backend)
        response = client.post(
            f"/api/v1/runs/{run.pk}/metrics/",
            raw,
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
        )
        assert response.status_code == 201, response.content
        return time.process_time() - web, backend_cpu_s(backend) - db

    parent = Run.objects.create(project=project, name="parent", created_by=user)
    last = args.parent_points // len(KEYS)  # the parent logged steps 0 .. last - 1
    started = time.perf_counter()
    for first in range(0, last, per_batch):
        post(parent, columns(first, min(per_batch, last - first)))
    print(f"load: {load()}")
    print(f"parent: {args.parent_points:,} points in {time.perf_counter() - started:.1f} s")
    start = last - args.overlap
    checkpoint = Checkpoint.objects.create(
        run=parent, step=start, state=CheckpointState.COMPLETE, file_count=1, created_by=user
    )
    Run.objects.filter(pk=parent.pk).update(status=RunStatus.FAILED)

    def child(name: str) -> Run:
        return Run.objects.create(
            project=project, name=name, created_by=user, parent=parent, source_checkpoint=checkpoint
        )

    # 3. the verdict within one batch: the child's first batch covers the whole overlap
    resumed = child("resumed")
    web, db = post(resumed, columns(start, per_batch))
    parity = Parity.objects.get(run=resumed)
    print(
        f"verdict after the child's first {args.batch:,}-point batch (steps {start:,}-{start + per_batch - 1:,}; "
        f"overlap {start:,}-{last - 1:,}): {parity.verdict}, {parity.compared_steps:,} steps x "
        f"{len(parity.compared_keys)} keys compared; that batch {web * 1e3:.1f} ms web + {db * 1e3:.0f} ms backend CPU"
    )
    small = child("resumed-small-batches")
    for count, first in enumerate(range(start, last + 2 * args.small, args.small), start=1):
        post(small, columns(first, args.small))
        parity = Parity.objects.get(run=small)
        if parity.compared_steps == args.overlap:
            print(
                f"SDK-sized batches ({args.small * len(KEYS)} points): the verdict covers the whole overlap "
                f"({parity.verdict}, {parity.compared_steps:,} steps) after batch {count}, the one that logs step "
                f"{last - 1:,} (steps {first:,}-{first + args.small - 1:,})"
            )
            break

    # 1. today's batch (the resumed child past the overlap, the receiver disconnected) against the same with it, in
    # pairs of random order; the receiver's own CPU measured inside those requests, web and backend alike

    uid = "parity.parity_follows_metrics"
    firsts = iter(range(start + per_batch, 10**12, per_batch))
    for _ in range(3):  # warm up
        post(resumed, columns(next(firsts), per_batch))
    inside = []
    real = receivers.parity_after_batch

    def timed(**kwargs):
        web, db = time.process_time(), backend_cpu_s(backend)
        real(**kwargs)
        inside.append((time.process_time() - web, backend_cpu_s(backend) - db))

    receivers.parity_after_batch = timed
    today, with_hook, order = [], [], random.Random(0)
    for _ in range(args.batches):
        arms = [False, True]
        order.shuffle(arms)
        for connected in arms:
            if connected:
                hooks.metrics_stored.connect(parity_follows_metrics, dispatch_uid=uid)
            else:
                hooks.metrics_stored.disconnect(dispatch_uid=uid)
            (with_hook if connected else today).append(post(resumed, columns(next(firsts), per_batch)))
    hooks.metrics_stored.connect(parity_follows_metrics, dispatch_uid=uid)
    receivers.parity_after_batch = real
    today_web, today_db = (statistics.mean(side) for side in zip(*today))
    hook_web, hook_db = (statistics.mean(side) for side in zip(*with_hook))
    paired = [sum(b) - sum(a) for a, b in zip(today, with_hook)]
    spread = statistics.stdev(paired) / len(paired) ** 0.5
    today_total = today_web + today_db
    print(
        f"a {args.batch:,}-point batch of the resumed child past the overlap, {args.batches} pairs: today "
        f"{today_web * 1e3:.2f} ms web + {today_db * 1e3:.2f} ms backend CPU; with the receiver {hook_web * 1e3:.2f} "
        f"+ {hook_db * 1e3:.2f} ms (pairs differ by {statistics.mean(paired) * 1e3:+.2f} ± {spread * 1e3:.2f} ms, "
        f"mean ± standard error: a shared machine's noise)"
    )

    # 2. the extra per batch: the receiver inside those requests, and the payload the ingest builds for it
    batch = sort_by_key(columns_from_columnar(columns(10**9, per_batch), now_ms=0))
    began = time.process_time()
    for _ in range(args.calls):
        firsts_, lasts_ = batch.steps[batch.starts], batch.steps[batch.starts + batch.counts - 1]
        dict(zip(batch.keys, zip(firsts_.tolist(), lasts_.tolist())))
    payload = (time.process_time() - began) / args.calls
    web, db = (statistics.mean(side) for side in zip(*inside))
    extra = web + db + payload
    print(
        f"extra per batch, resumed child past the overlap (measured inside the requests): receiver {web * 1e3:.3f} ms "
        f"web + {db * 1e3:.3f} ms backend CPU, payload {payload * 1e3:.3f} ms = {extra * 1e3:.3f} ms, "
        f"{100 * extra / today_total:.1f} % of today's {today_total * 1e3:.1f} ms"
    )
    plain = Run.objects.create(project=project, name="plain", created_by=user)
    post(plain, columns(0, per_batch))
    plain = Run.objects.get(pk=plain.pk)
    steps = dict.fromkeys(KEYS, (per_batch, 2 * per_batch - 1))
    web, db = time.process_time(), backend_cpu_s(backend)
    for _ in range(args.calls):
        parity_after_batch(run=plain, steps=steps)
    web, db = (time.process_time() - web) / args.calls, (backend_cpu_s(backend) - db) / args.calls
    print(
        f"extra per batch, a run that is no parent or child (the receiver alone, {args.calls:,} calls): "
        f"{web * 1e3:.3f} ms web + {db * 1e3:.3f} ms backend CPU = {100 * (web + db + payload) / today_total:.1f} % "
        f"of today's batch"
    )
    print(f"load: {load()}")


if __name__ == "__main__":
    main()
