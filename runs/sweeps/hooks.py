"""What the Run lifecycle tells a Run's sweep trial (SPEC F28). Called by runs services, in their transaction.

Placeholder signatures agreed for issue 6; the sweeps helper implements them.
"""


def sweep_trial_run_started(*, run) -> None:
    """``run`` was started or resumed by its program: its trial (if any) becomes running, its lease fulfilled."""


def sweep_trial_run_ended(*, run) -> None:
    """``run`` reached a final state: a preempted trial goes back to the queue (requeue_count + 1), else done."""
