"""What the sweeps app does when runs tells of a Run's life (``runs.hooks``; docs/design/house.md#arrows): the Run's
sweep trial follows it (docs/design/sweeps.md#requeue)."""

from runs import hooks
from sweeps.hooks import sweep_trial_run_ended, sweep_trial_run_started


def trial_of_started_run(sender, *, run, **kwargs) -> None:
    """A Run was started (attached) or resumed by its program: its trial, if any, becomes running."""
    sweep_trial_run_started(run=run)


def trial_of_ended_run(sender, *, run, **kwargs) -> None:
    """A Run reached a final state: its trial goes back to the queue when the Run was preempted, else is done."""
    sweep_trial_run_ended(run=run)


def connect() -> None:
    """Connect the receivers above to ``runs.hooks``; called once from ``SweepsConfig.ready``."""
    hooks.run_started.connect(trial_of_started_run, dispatch_uid="sweeps.trial_of_started_run")
    hooks.run_ended.connect(trial_of_ended_run, dispatch_uid="sweeps.trial_of_ended_run")
