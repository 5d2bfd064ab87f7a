"""Periodic work of the sweeps app (beat; docs/design/house.md#tasks)."""

from celery import shared_task


@shared_task(name="sweeps.tasks.release_sweep_leases", ignore_result=True)
def release_sweep_leases() -> int:
    """Return sweep trials whose claim expired (``MMT_SWEEP_LEASE``) to the queue; docs/design/sweeps.md#requeue.

    Scheduled every 60 s by beat (``mado.periodic``); returns how many trials it released
    (``sweeps.services.sweep_release_expired_leases``).
    """
    from sweeps.services import sweep_release_expired_leases

    return sweep_release_expired_leases()
