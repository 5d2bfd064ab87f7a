"""Alert deliveries and the alerts app's periodic work (docs/design/house.md#tasks; docs/design/alerts.md#delivery)."""

from celery import shared_task


@shared_task(name="alerts.tasks.deliver", ignore_result=True)
def deliver(delivery_id: int, attempt: int) -> str | None:
    """Make attempt ``attempt`` of Delivery ``delivery_id`` (``services.delivery.delivery_attempt``); its status
    after, or None when that attempt was made already."""
    from alerts.services.delivery import delivery_attempt

    return delivery_attempt(delivery_id=delivery_id, attempt=attempt)


@shared_task(name="alerts.tasks.retry_deliveries", ignore_result=True)
def retry_deliveries() -> int:
    """Queue the next attempt of deliveries whose backoff passed (beat, every ``MADO_REAPER_INTERVAL`` s)."""
    from alerts.services.delivery import deliveries_retry_due

    return deliveries_retry_due()


@shared_task(name="alerts.tasks.check_stalled_metrics", ignore_result=True)
def check_stalled_metrics() -> int:
    """Fire the stalled-loop rules (``evaluate.stalled_runs_check``; beat, every ``MADO_REAPER_INTERVAL`` s)."""
    from alerts.evaluate import stalled_runs_check

    return stalled_runs_check()
