"""Each app schedules its own periodic checks (docs/design/house.md#tasks): beat's schedule, as the apps left it."""

from mado.periodic import beat_schedule, schedule_every_interval


def test_every_apps_checks_are_scheduled_on_the_maintenance_queue(settings):
    schedule = beat_schedule()
    assert {name: entry["task"] for name, entry in schedule.items()} == {
        "reap-crashed-runs": "runs.tasks.reap_crashed_runs",
        "release-sweep-leases": "sweeps.tasks.release_sweep_leases",
        "end-abandoned-checkpoints": "checkpoints.tasks.end_abandoned_checkpoints",
        "apply-scheduled-retention": "checkpoints.tasks.apply_scheduled_retention",
        "scrub-checkpoints": "checkpoints.tasks.scrub_checkpoints",
        "alerts-retry-deliveries": "alerts.tasks.retry_deliveries",
        "alerts-stalled-metrics": "alerts.tasks.check_stalled_metrics",
        "reap-stale-jobs": "jobs.tasks.reap_stale_jobs",
        "flush-dispatches": "mado.tasks.flush_dispatches",
        "reap-undelivered": "mado.tasks.reap_undelivered",
    }
    for entry in schedule.values():
        assert entry["schedule"] == float(settings.MADO_REAPER_INTERVAL)
        assert entry["options"]["queue"] == settings.MADO_MAINTENANCE_QUEUE


def test_registering_a_name_again_replaces_its_entry(settings):
    before = beat_schedule()
    try:
        schedule_every_interval("flush-dispatches", "mado.tasks.reap_undelivered")
        assert beat_schedule()["flush-dispatches"]["task"] == "mado.tasks.reap_undelivered"
        assert len(beat_schedule()) == len(before)
    finally:
        schedule_every_interval("flush-dispatches", before["flush-dispatches"]["task"])


def test_the_celery_app_hands_the_apps_schedule_to_beat():
    from config.celery import app

    assert app.conf.beat_schedule == beat_schedule()
    assert "runs.tasks.reap_crashed_runs" in {entry["task"] for entry in app.conf.beat_schedule.values()}
