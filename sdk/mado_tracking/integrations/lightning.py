"""PyTorch Lightning and mado (docs/integrations.md, "PyTorch Lightning"; docs/design/resume.md#exact-resume,
#in-the-code; docs/design/runs.md#preemption).

    from mado_tracking.integrations.lightning import MadoLogger, MadoResume, ResumableDataLoader, resume_ckpt_path

    logger = MadoLogger(project="vision")
    trainer = pl.Trainer(logger=logger, callbacks=[ModelCheckpoint(every_n_train_steps=500), MadoResume()])
    trainer.fit(model, ResumableDataLoader(dataset, batch_size=64, seed=0), ckpt_path=resume_ckpt_path(logger))

- ``MadoLogger``: parameters, metrics at the global step, each ``ModelCheckpoint`` file a Checkpoint;
- ``MadoResume``: every RNG in each checkpoint and set back on resume; a warning before the first step when the
  data position cannot be restored, and the restore report of what ``fit(ckpt_path=...)`` loaded (without it,
  ``MadoLogger`` reports the RNGs and the data position not restored); on SIGTERM/SIGUSR1 a complete Checkpoint
  at the next step, exit preempted;
- ``ResumableDataLoader`` / ``ResumableSampler``: a shuffled order that resumes mid-epoch;
- ``resume_ckpt_path``: the ``.ckpt`` file to hand to ``fit(ckpt_path=...)`` in a resumed run, else None.

``lightning.pytorch`` is used, or ``pytorch_lightning`` where only that is installed.
"""

from __future__ import annotations

from pathlib import Path

from mado_tracking.errors import ResumeError
from mado_tracking.integrations.lightning_data import ResumableDataLoader, ResumableSampler
from mado_tracking.integrations.lightning_logger import MadoLogger, flatten_parameters
from mado_tracking.integrations.lightning_resume import MadoResume, rng_states, set_rng_states

__all__ = [
    "MadoLogger",
    "MadoResume",
    "ResumableDataLoader",
    "ResumableSampler",
    "flatten_parameters",
    "resume_ckpt_path",
    "rng_states",
    "set_rng_states",
]

CKPT_SUFFIX = ".ckpt"


def resume_ckpt_path(run=None) -> str | None:
    """The Lightning checkpoint file to resume from, for ``trainer.fit(..., ckpt_path=resume_ckpt_path(run))``, or
    None when this process is not resuming (docs/design/resume.md#in-the-code).

    ``run``: a Run (``run.resume_checkpoint()``), a ``MadoLogger`` (its ``resume_checkpoint()``: the Run is not
    started for that unless it is a same-run resume), or None (``mado_tracking.resume_checkpoint()``, the
    ``MMT_RESUME_*`` variables of a Job). The answer is the one ``.ckpt`` file in the checkpoint's directory.

    Raises:
        ResumeError: the checkpoint directory holds no ``.ckpt`` file or more than one (not a checkpoint
            ``MadoLogger`` or ``MadoResume`` saved), naming the directory and what it found; or what
            ``resume_checkpoint()`` raises.
    """
    if run is None:
        from mado_tracking.resume import resume_checkpoint

        checkpoint = resume_checkpoint()
    else:
        checkpoint = run.resume_checkpoint()
    if checkpoint is None:
        return None
    directory = Path(checkpoint.path)
    found = sorted(path for path in directory.rglob(f"*{CKPT_SUFFIX}") if path.is_file())
    if len(found) != 1:
        listed = ", ".join(str(path.relative_to(directory)) for path in found[:5]) or "none"
        raise ResumeError(
            f"{directory}: expected one Lightning checkpoint file (*{CKPT_SUFFIX}) to resume from, found "
            f"{len(found)} ({listed}); checkpoint {checkpoint.id} was not saved by MadoLogger"
        )
    return str(found[0])
