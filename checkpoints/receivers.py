"""What the checkpoints app does when runs tells of a Run's life (``runs.hooks``; docs/design/house.md#arrows), and how
the outbox tells whether a verification message is still awaited (``mado.outbox``)."""

from checkpoints.services.direct import VERIFY_TASK
from checkpoints.services.janitor import verification_give_up, verification_waits
from checkpoints.services.mlflow_checkpoints import checkpoint_files_complete_for_run
from mado import outbox
from runs import hooks


def complete_files_of_ended_run(sender, *, run, **kwargs) -> None:
    """A Run ended: files logged under ``checkpoints/step-N/`` through the MLflow API become usable
    (docs/design/checkpoints.md#mlflow-checkpoints)."""
    checkpoint_files_complete_for_run(run_id=run.pk)


def connect() -> None:
    """Connect the receivers above to ``runs.hooks``; called once from ``CheckpointsConfig.ready``."""
    hooks.run_ended.connect(complete_files_of_ended_run, dispatch_uid="checkpoints.complete_files_of_ended_run")
    outbox.register(VERIFY_TASK, waiting=verification_waits, give_up=verification_give_up)
