"""Where higher apps (checkpoints, jobs) take part in a Run's life without runs importing them (ARCHITECTURE rule 7).

The arrows point one way: jobs → checkpoints → sweeps → runs → mado. When something in
runs must reach a higher app — a Run ended, so its MLflow checkpoint files
complete; a Job's state decides the Run's liveness; the Run page shows its
Job — runs sends one of the signals below and the higher app answers from a
receiver it connects in its ``AppConfig.ready()``. With no receiver connected
each signal has a safe answer (nothing happens, nobody vouches, nothing ended).

- ``run_started(run)``: ``run`` was started by its program: a ``pending``
  Run attached, or a Run resumed (not a Run created running); sent inside
  the transaction that started it (the sweeps app: its trial becomes running).
- ``run_ended(run)``: ``run`` reached a final state; sent inside the
  transaction that ended it, once per change of status.
- ``run_kept_alive(run_id, now)``: a receiver returns True to spare a silent
  Run from the crash reaper (its Job's worker still beats).
- ``run_ran_as_job(run)``: a receiver returns True when the Run is a Job's
  (only its writers may then reopen it by id).
- ``run_job_ended(run)``: a receiver returns True when the Run's Job has
  ended (the Run takes no more data stages).
- ``run_page_context(run, user)``: each receiver returns a dict merged into
  every tab of the Run page (e.g. ``{"job": ...}``).
"""

from django.dispatch import Signal

run_started = Signal()
run_ended = Signal()
run_kept_alive = Signal()
run_ran_as_job = Signal()
run_job_ended = Signal()
run_page_context = Signal()


def any_receiver_says(signal: Signal, **kwargs) -> bool:
    """True when a receiver of ``signal`` (sent with ``sender=None`` and ``kwargs``) returns a truthy answer."""
    return any(answer for _receiver, answer in signal.send(sender=None, **kwargs))


def merged_answers(signal: Signal, **kwargs) -> dict:
    """The dict answers of ``signal``'s receivers merged in connection order (None answers are skipped)."""
    merged: dict = {}
    for _receiver, answer in signal.send(sender=None, **kwargs):
        merged.update(answer or {})
    return merged
