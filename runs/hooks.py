"""The events of a Run's life that higher apps (sweeps, checkpoints, jobs, the MLflow API) act on, unimported.

The arrows point one way (docs/design/house.md#arrows): when something in
runs must start work in a higher app, runs sends an event below and the
higher app connects a receiver in its ``AppConfig.ready()``. Signals carry
events, never questions: what runs needs to know about a higher app (the
Run ran as a Job, its Job ended, its Job's worker vouches for it) is
written onto the Run by the app that knows (``Run.ran_as_job``,
``Run.job_ended``, ``Run.job_alive_until``).

- ``run_started(run)``: ``run`` was started by its program: a ``pending``
  Run attached, or a Run resumed (not a Run created running); sent inside
  the transaction that started it (the sweeps app: its trial becomes running).
- ``run_ended(run)``: ``run`` reached a final state; sent inside the
  transaction that ended it, once per change of status.
"""

from django.dispatch import Signal

run_started = Signal()
run_ended = Signal()
