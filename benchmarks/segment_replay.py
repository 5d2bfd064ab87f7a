"""What a same-run resume's replay below the floor costs beside logging the same points normally
(docs/design/resume.md#same-run-parity): prints figures, asserts nothing.

In one process against a fresh database, for each shape ``BATCHESxPOINTS`` in ``--shapes``: a Run logs
``BATCHES * POINTS`` points of one key (steps 0, 1, …) in ``BATCHES`` batches through ``metrics_ingest`` with the
after-commit hooks (``normal``); it is then resumed under its id (its floor past those steps) and logs the same steps
again in the same batches: every point lands in the resume segment and the segment's verdict follows each batch
(``replay``). Then one late point into the segment's first block (``late point``).

    .venv/bin/python benchmarks/segment_replay.py                      # SQLite under a temp dir
    .venv/bin/python benchmarks/segment_replay.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from metrics_ingest import in_process  # noqa: E402


def shape(text: str) -> tuple[int, int]:
    batches, points = text.lower().split("x")
    return int(batches), int(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="PostgreSQL URL (the database is dropped and recreated); default SQLite")
    parser.add_argument("--shapes", type=shape, nargs="+", default=[(200, 100), (20, 1000), (4, 5000)])
    args = parser.parse_args()

    user, project = in_process(args.database_url, "mado-bench-segments-")
    from runs.metrics import metrics_ingest
    from runs.models import ResumeSegment, RunStatus
    from runs.resume import run_start
    from runs.services import run_set_status

    def log(run, first: int, count: int) -> None:
        steps = list(range(first, first + count))
        columns = {"keys": ["loss"] * count, "steps": steps, "values": [1.0 / (s + 1) for s in steps]}
        metrics_ingest(actor=user, run=run, columns=columns, fencing_token=run.lease_token)

    def timed(run, batches: int, points: int) -> float:
        started = time.perf_counter()
        for n in range(batches):
            log(run, n * points, points)
        return time.perf_counter() - started

    for batches, points in args.shapes:
        name = f"exp-{batches}x{points}"
        run = run_start(actor=user, project=project, external_id=name, resume="allow", host="bench", pid=1).run
        normal = timed(run, batches, points)
        run_set_status(actor=user, run=run, status=RunStatus.FAILED)
        run = run_start(actor=user, project=project, external_id=name, resume="allow", host="bench", pid=2).run
        replay = timed(run, batches, points)
        started = time.perf_counter()
        log(run, 3, 1)
        late = time.perf_counter() - started
        segment = ResumeSegment.objects.get(run=run, number=1)
        print(
            f"{batches} x {points:,} points of one key: normal {normal:.2f} s, replay {replay:.2f} s "
            f"({replay / normal:.1f} x); late point {late * 1000:.1f} ms; verdict {segment.verdict} over "
            f"{segment.compared_points:,} points"
        )


if __name__ == "__main__":
    main()
