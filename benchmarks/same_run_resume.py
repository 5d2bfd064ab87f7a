"""Same-run resume and sweep claims (docs/design/runs.md#resume-modes, #one-writer-process;
docs/design/sweeps.md#requeue): prints figures, asserts nothing.

In-process against a fresh database: for each size in ``--points`` a Run
logs that many metric points (through ``metrics_ingest``, 10,000 a batch),
then is resumed by id (``run_start(resume="allow")``, which reads the last
step, takes a new fencing token and merges parameters) ``--resumes`` times;
the ratio of the largest Run's median to the smallest's shows whether resume
grows with a Run's size (it reads per-key summaries, so it should not). Then
``--claims`` claims of a random-search sweep (Optuna, rebuilt from the
finished trials each time) are timed one by one, each trial finished with a
metric.

    .venv/bin/python benchmarks/same_run_resume.py                      # SQLite under a temp dir
    .venv/bin/python benchmarks/same_run_resume.py --database-url postgresql://postgres@127.0.0.1:5432/mado_bench
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from metrics_ingest import in_process  # noqa: E402

SWEEP = {
    "method": "random",
    "metric": {"name": "val_loss", "goal": "minimize"},
    "parameters": {
        "lr": {"min": 1e-4, "max": 1e-1, "distribution": "log_uniform_values"},
        "hidden": {"values": [32, 64, 128, 256]},
    },
    "program": "python train.py",
}


def milliseconds(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (
        f"median {statistics.median(ordered) * 1000:.1f} ms, p90 {ordered[int(len(ordered) * 0.9)] * 1000:.1f} ms, "
        f"max {ordered[-1] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="PostgreSQL URL (the database is dropped and recreated); default SQLite")
    parser.add_argument(
        "--points",
        type=int,
        nargs="+",
        default=[100_000, 3_000_000],
        help="metric points of each resumed Run (one Run per size)",
    )
    parser.add_argument("--resumes", type=int, default=20)
    parser.add_argument("--claims", type=int, default=50)
    args = parser.parse_args()

    user, project = in_process(args.database_url, "mado-bench-resume-")
    from runs.metrics import metrics_ingest
    from runs.models import RunStatus
    from runs.resume import run_start
    from runs.services import run_set_status
    from sweeps.services import sweep_claim, sweep_create

    medians = {}
    for size in args.points:
        name = f"exp-{size}"
        run = run_start(actor=user, project=project, external_id=name, resume="allow", host="bench", pid=1).run
        started = time.perf_counter()
        for first in range(0, size, 10_000):
            count = min(10_000, size - first)
            steps = [(first + i) // 2 for i in range(count)]
            columns = {
                "keys": ["loss" if i % 2 else "acc" for i in range(count)],
                "steps": steps,
                "values": [0.5] * count,
                "timestamps": [1.0] * count,
            }
            metrics_ingest(actor=user, run=run, columns=columns, fencing_token=run.lease_token)
        logged = time.perf_counter() - started
        resumes = []
        for n in range(args.resumes):
            run_set_status(actor=user, run=run, status=RunStatus.FAILED)
            started = time.perf_counter()
            run = run_start(
                actor=user,
                project=project,
                external_id=name,
                resume="allow",
                host="bench",
                pid=n,
                parameters={"lr": 0.1, f"extra{n}": n},
            ).run
            resumes.append(time.perf_counter() - started)
        medians[size] = statistics.median(resumes)
        print(
            f"run of {size:,} points (logged in {logged:.1f} s, {size / logged:,.0f} points/s in-process); "
            f"step floor now {run.step_floor:,}; resume by id ({args.resumes} times): {milliseconds(resumes)}"
        )
    small, large = min(medians), max(medians)
    print(f"resume by id, median at {large:,} / at {small:,} points: {medians[large] / medians[small]:.2f}")

    sweep = sweep_create(actor=user, project=project, config=SWEEP)
    claims = []
    for n in range(args.claims):
        started = time.perf_counter()
        trial = sweep_claim(actor=user, sweep=sweep, agent=f"bench:{n}").trial
        claims.append(time.perf_counter() - started)
        trial_run = run_start(
            actor=user, project=project, external_id=trial.run.external_id, resume="allow", host="bench", pid=n
        ).run
        metrics_ingest(actor=user, run=trial_run, points=[{"key": "val_loss", "value": 1.0 / (n + 1), "step": 0}])
        run_set_status(actor=user, run=trial_run, status=RunStatus.FINISHED)

    print(f"sweep claims (random search, Optuna, 1..{args.claims} finished trials): {milliseconds(claims)}")


if __name__ == "__main__":
    main()
