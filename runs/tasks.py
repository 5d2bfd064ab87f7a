"""Periodic work of the runs app (beat; docs/design/house.md#tasks): the crash reaper of silent Runs."""

from celery import shared_task


@shared_task(name="runs.tasks.reap_crashed_runs", ignore_result=True)
def reap_crashed_runs() -> int:
    """Mark Runs whose SDK heartbeat stopped ``crashed`` (``preempted`` when preempting); docs/design/runs.md#states.

    Scheduled every 60 s by beat (``mado.periodic``); returns how many Runs it ended
    (``runs.liveness.runs_reap_crashed``).
    """
    from runs.liveness import runs_reap_crashed

    return runs_reap_crashed()
