"""How the outbox tells whether a checkpoint verification message is still awaited (``mado.outbox``)."""

from checkpoints.services.direct import VERIFY_TASK
from checkpoints.services.janitor import verification_give_up, verification_waits
from mado import outbox


def connect() -> None:
    """Register the verification task's outbox hooks; called once from ``CheckpointsConfig.ready``."""
    outbox.register(VERIFY_TASK, waiting=verification_waits, give_up=verification_give_up)
