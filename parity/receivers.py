"""What the parity app does when runs stores a metrics batch (``runs.hooks.metrics_stored``;
docs/design/house.md#arrows): the verdicts the batch's Run takes part in follow it (docs/design/resume.md#parity)."""

from parity.services.verdict import parity_after_batch
from runs import hooks


def parity_follows_metrics(sender, *, run, keys, first_step, last_step, **kwargs) -> None:
    """A batch of ``run`` committed: its verdicts (as the child or the parent) compare the batch's blocks again."""
    parity_after_batch(run=run, keys=keys, first_step=first_step, last_step=last_step)


def connect() -> None:
    """Connect the receiver above to ``runs.hooks``; called once from ``ParityConfig.ready``."""
    hooks.metrics_stored.connect(parity_follows_metrics, dispatch_uid="parity.parity_follows_metrics")
