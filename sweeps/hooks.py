"""What the Run lifecycle tells a Run's sweep trial (docs/design/sweeps.md#requeue). Called by the receivers of
``runs.hooks.run_started`` and ``runs.hooks.run_ended`` (``sweeps.receivers``), inside the runs service's transaction.

Both are one conditional UPDATE on the trial row of the Run (none when the
Run is not a trial), so calling one twice for the same change is harmless.
"""

from django.db.models import F

from runs.models import Run, RunStatus
from sweeps.models import SweepTrial, TrialState


def sweep_trial_run_started(*, run) -> None:
    """``run`` was started (attached) or resumed by its program: its trial, if any, becomes running.

    The claim's lease is fulfilled (``lease_expires_at`` cleared); ``agent``
    keeps naming who runs it.
    """
    SweepTrial.objects.filter(run_id=run.pk).exclude(state=TrialState.RUNNING).update(
        state=TrialState.RUNNING, lease_expires_at=None
    )


def sweep_trial_run_ended(*, run) -> None:
    """``run`` reached a final state: a preempted trial goes back to the queue (requeue_count + 1), else done.

    The Run's status is read from the database (the caller's instance may
    predate the change). A trial already queued is not requeued again.
    """
    status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
    trials = SweepTrial.objects.filter(run_id=run.pk)
    if status == RunStatus.PREEMPTED:
        trials.exclude(state=TrialState.QUEUED).update(
            state=TrialState.QUEUED, requeue_count=F("requeue_count") + 1, agent="", lease_expires_at=None
        )
    else:
        trials.exclude(state=TrialState.DONE).update(state=TrialState.DONE, lease_expires_at=None)
