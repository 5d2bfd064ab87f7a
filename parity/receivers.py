"""What the parity app does when runs stores a metrics batch (``runs.hooks.metrics_stored``;
docs/design/house.md#arrows): the verdicts the batch's Run takes part in follow it (docs/design/resume.md#parity)."""

from parity.services.segments import segment_verdict_refresh
from parity.services.verdict import parity_after_batch
from runs import hooks


def parity_follows_metrics(sender, *, run, steps, **kwargs) -> None:
    """A batch of ``run`` committed (``steps``: each key's first and last step in it): its verdicts, as the child or
    the parent, compare the batch's blocks again."""
    parity_after_batch(run=run, steps=steps)


def segment_follows_points(sender, *, segment_id, steps, **kwargs) -> None:
    """A batch kept points below its Run's floor as resume segment ``segment_id``'s (``steps``: each key's first and
    last step among them): that segment's verdict follows, the blocks the batch reached compared again
    (docs/design/resume.md#same-run-parity)."""
    segment_verdict_refresh(segment_id=segment_id, steps=steps)


def connect() -> None:
    """Connect the receivers above to ``runs.hooks``; called once from ``ParityConfig.ready``."""
    hooks.metrics_stored.connect(parity_follows_metrics, dispatch_uid="parity.parity_follows_metrics")
    hooks.segment_points_stored.connect(segment_follows_points, dispatch_uid="parity.segment_follows_points")
