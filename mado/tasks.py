"""Periodic work of the outbox (beat; docs/design/house.md#tasks): send what the broker refused, re-send or give up
what no worker took."""

from celery import shared_task


@shared_task(name="mado.tasks.flush_dispatches", ignore_result=True)
def flush_dispatches() -> int:
    """Send the outbox's messages that the broker refused (it was down); returns how many it took
    (docs/design/worker.md#subprocess).

    Scheduled every ``MADO_REAPER_INTERVAL`` s (``mado.outbox.dispatch_flush``).
    """
    from mado.outbox import dispatch_flush

    return dispatch_flush()


@shared_task(name="mado.tasks.reap_undelivered", ignore_result=True)
def reap_undelivered() -> int:
    """Re-send, then give up, messages that no worker took within ``MADO_DISPATCH_TIMEOUT`` s
    (docs/design/worker.md#subprocess).

    A queued Job is sent once more, then failed "The Job never started…";
    a checkpoint verification likewise ends the checkpoint ``error``
    (``mado.outbox.dispatch_reap_overdue``). Scheduled every ``MADO_REAPER_INTERVAL`` s.
    """
    from mado.outbox import dispatch_reap_overdue

    return dispatch_reap_overdue()
