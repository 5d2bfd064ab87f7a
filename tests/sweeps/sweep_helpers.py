"""Helpers of the sweep tests: a sweep from a config, a trial's program starting its Run, a metric logged."""

from runs.metrics import metrics_ingest
from runs.resume import run_start
from sweeps.services import sweep_create

GRID = {
    "name": "digits",
    "method": "grid",
    "metric": {"name": "val_loss", "goal": "minimize"},
    "parameters": {"lr": {"values": [0.1, 0.01]}, "hidden": {"values": [32, 64]}, "epochs": {"value": 3}},
    "program": "python examples/sweep_training.py --fast",
}

RANDOM = {
    "method": "random",
    "metric": {"name": "acc", "goal": "maximize"},
    "parameters": {
        "lr": {"min": 1e-4, "max": 1e-1, "distribution": "log_uniform_values"},
        "hidden": {"min": 8, "max": 128},
        "dropout": {"min": 0.0, "max": 0.5},
        "optimizer": {"values": ["adam", "sgd"]},
    },
    "program": ["python", "train.py"],
}


def make_sweep(*, actor, project, base=GRID, **changes):
    """A Sweep created through ``sweep_create`` from ``base`` with top-level keys replaced by ``changes``."""
    return sweep_create(actor=actor, project=project, config={**base, **changes})


def start_program(*, actor, trial, pid=4242):
    """What the trial's program does: ``start_run`` with ``MMT_RUN_ID`` and ``MMT_RESUME=allow``."""
    return run_start(
        actor=actor, project=trial.run.project, external_id=trial.run.external_id, resume="allow", host="gpu-1", pid=pid
    ).run


def log_metric(*, actor, run, key, values):
    """Log ``values`` of ``key`` at steps 0, 1, …"""
    points = [{"key": key, "value": value, "step": step} for step, value in enumerate(values)]
    metrics_ingest(actor=actor, run=run, points=points)
