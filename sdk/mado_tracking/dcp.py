"""Sharded checkpoints: ``torch.distributed.checkpoint`` (DCP) from every rank, stored as ONE Checkpoint
(docs/design/worker.md#distributed).

    state = {"model": model_state, "optim": optim_state}     # e.g. torch.distributed.checkpoint.state_dict
    checkpoint = run.resume_checkpoint()                       # the same directory on every rank
    start = load_distributed(state, checkpoint.path) if checkpoint else 0   # in place, resharded
    ...
    run.log_checkpoint_distributed(state, step=step + 1)       # every rank

``log_distributed`` (behind ``run.log_checkpoint_distributed``) writes the
state with ``torch.distributed.checkpoint.save`` into a fresh per-step
staging directory (``MMT_DCP_DIR``, default ``<cwd>/.mado/dcp``, then
``<run id>/step-<N>``; on one machine every rank sees the same one), waits
for every rank, and rank 0 uploads the whole directory as one Checkpoint
(``framework="torch-dcp"``, its ``world_size``, a manifest listing every
shard). The server completes it only when every rank's shard is in it and
every byte matches; the worker verifies it again before any rank of a
resumed Job starts. DCP reshards on load, so a Job resumed with another
``nproc_per_node`` loads it. Works without a process group too (one process).
"""

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from mado_tracking.checkpoints import SavedCheckpoint, check_step
from mado_tracking.errors import CheckpointError, ResumeError
from mado_tracking.integrations.restore_report import report_loaded
from mado_tracking.ranks import broadcast, process_group_ranks
from mado_tracking.resume import resume_checkpoint

ENV_DCP_DIR = "MMT_DCP_DIR"
FRAMEWORK = "torch-dcp"
INFO_FILE = "mado-checkpoint.json"  # the same name as mado_tracking.torch's, with "framework": "torch-dcp"
FORMAT = 1


def save_distributed(state_dict: dict, directory) -> Path:
    """``torch.distributed.checkpoint.save(state_dict)`` into ``directory`` from every rank; return it as a Path.

    A collective: every rank of the process group calls it with its own
    shards. Nothing is uploaded (``run.log_checkpoint_distributed`` does).
    """
    directory = Path(directory)
    dcp.save(state_dict, checkpoint_id=directory)
    return directory


def load_distributed(state_dict: dict, directory=None) -> int:
    """Load a sharded checkpoint into ``state_dict`` in place (resharded to this world size); return its step.

    ``directory``: the checkpoint (default: ``resume_checkpoint().path``, the
    one the worker restored). Every rank calls it. A resuming process then
    reports what it restored (docs/design/resume.md#restore-report): the
    parts ``state_dict``'s top-level names name (``model``; ``optim`` or
    ``optimizer``; ``scheduler`` or ``lr_scheduler``; ``scaler``) and the
    global step. Raises ``ResumeError``
    when no directory is given and the process is not resuming, or the
    directory is not a ``torch-dcp`` checkpoint saved by mado.
    """
    if directory is None:
        checkpoint = resume_checkpoint()
        if checkpoint is None:
            raise ResumeError("load_distributed: no directory given and not resuming (MMT_RESUME_* unset)")
        directory = checkpoint.path
    directory = Path(directory)
    try:
        info = json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ResumeError(f"{directory}: no readable {INFO_FILE} ({exc}): not a sharded checkpoint of mado") from None
    if not isinstance(info, dict) or info.get("framework") != FRAMEWORK or not isinstance(info.get("step"), int):
        raise ResumeError(
            f"{directory}/{INFO_FILE}: not a {FRAMEWORK} checkpoint (framework "
            f"{info.get('framework') if isinstance(info, dict) else None!r})"
        )
    dcp.load(state_dict, checkpoint_id=directory)
    report_loaded(
        directory,
        step=info["step"],
        holds=sorted({_PARTS[name] for name in state_dict if name in _PARTS}),
        declare_position="the batches of a step follow from the step alone, or save the position in the state dict",
    )
    return info["step"]


# the state dict's top-level names that name a part of a restore report (docs/design/resume.md#restore-report)
_PARTS = {
    "model": "model",
    "optim": "optimizer",
    "optimizer": "optimizer",
    "scheduler": "scheduler",
    "lr_scheduler": "scheduler",
    "scaler": "scaler",
}


def staging_directory(run_label: str, step: int) -> Path:
    """Where every rank writes its shards of ``step`` before rank 0 uploads them."""
    root = Path(os.environ.get(ENV_DCP_DIR, "").strip() or Path.cwd() / ".mado" / "dcp")
    return root / run_label / f"step-{step}"


def log_distributed(run, state_dict: dict, *, step: int, includes_optimizer: bool = False) -> SavedCheckpoint:
    """Every rank: save this rank's shards of ``state_dict`` at ``step`` as part of one Checkpoint
    (docs/design/worker.md#distributed).

    In order: rank 0 empties the step's staging directory (no stale shard of
    an earlier world size can slip in), barrier, ``save_distributed``,
    rank 0 writes ``mado-checkpoint.json`` (step, ``world_size``,
    ``framework``) and uploads the directory with ``world_size`` through the
    same path as ``log_checkpoint(wait=True)``, then removes it, and every
    rank gets the outcome. ``step``: steps completed (int >= 0).

    Returns the same ``SavedCheckpoint`` on every rank once the server
    completed it. Raises ``CheckpointError`` on every rank when rank 0's
    upload failed (rank 0 raises its own error: ``CheckpointError``,
    ``ApiError`` or ``MadoError`` as ``log_checkpoint``), and for a bad ``step``.
    """
    rank, world_size = process_group_ranks()
    step = check_step(step, "log_checkpoint_distributed")
    directory = staging_directory(run.external_id or str(run.id), step)
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    if world_size > 1:
        dist.barrier()
    save_distributed(state_dict, directory)
    if world_size > 1:
        dist.barrier()
    outcome, failure = None, None
    if rank == 0:
        try:
            info = {
                "format": FORMAT,
                "framework": FRAMEWORK,
                "step": step,
                "world_size": world_size,
                "torch": torch.__version__,
            }
            (directory / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            outcome = {"saved": run._save_sharded(directory, step, includes_optimizer, world_size)}
        except Exception as error:  # noqa: BLE001 - every rank must learn it, then rank 0 raises its own
            failure, outcome = error, {"error": f"{type(error).__name__}: {error}"}
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if world_size > 1:
        outcome = broadcast(outcome, rank)
    if failure is not None:
        raise failure
    if "error" in outcome:
        raise CheckpointError(
            f"rank {rank}: rank 0 could not save the sharded checkpoint at step {step}: {outcome['error']}",
            field="step",
        )
    return outcome["saved"]
