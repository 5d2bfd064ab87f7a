"""mado_tracking: the Python SDK of mado (docs/design/checkpoints.md#a-checkpoint;
docs/design/resume.md#steps-continue, #in-the-code; docs/design/runs.md; docs/design/sweeps.md#sweeps;
docs/design/interfaces.md#surfaces), a pure HTTP client of ``/api/v1/``.

    import mado_tracking

    checkpoint = mado_tracking.resume_checkpoint()      # None unless resuming (MMT_RESUME_*)
    with mado_tracking.start_run(project="vision", name="baseline", parameters={"lr": 0.1}) as run:
        for step in range(checkpoint.step if checkpoint else 0, steps):
            ...
            run.log_metrics({"train.loss": loss}, step=step)
            run.log_checkpoint("ckpt", step=step + 1, includes_optimizer=True, framework="torch")

Configuration: arguments, else ``MMT_API_URL``, ``MMT_API_TOKEN``, ``MMT_PROJECT``;
``start_run(offline=True)`` or ``MMT_MODE=offline`` needs no server (``mado sync DIR`` later).
``start_run(id="exp-42", resume="allow")`` (``MMT_RUN_ID`` / ``MMT_RESUME``) continues a run under its id,
``run.mark_preempting()`` makes a non-zero exit end it ``preempted`` (``mado_tracking.resume_mode``,
``mado_tracking.lease``).
``mado_tracking.torch`` saves and restores model, optimizer, scheduler and RNG states;
``download_checkpoint(id, path)`` fetches a checkpoint's tar (resumed with HTTP Range, SHA-256 checked).
"""

from mado_tracking._version import __version__
from mado_tracking.checkpoints import SavedCheckpoint
from mado_tracking.download import download_checkpoint
from mado_tracking.errors import ApiError, CheckpointError, ConfigError, MadoError, ResumeError
from mado_tracking.offline import OfflineRun
from mado_tracking.resume import ResumeCheckpoint, resume_checkpoint
from mado_tracking.run import Run
from mado_tracking.start import start_run

__all__ = [
    "ApiError",
    "CheckpointError",
    "ConfigError",
    "MadoError",
    "OfflineRun",
    "ResumeCheckpoint",
    "ResumeError",
    "Run",
    "SavedCheckpoint",
    "__version__",
    "download_checkpoint",
    "resume_checkpoint",
    "start_run",
]
