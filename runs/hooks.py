"""The events of a Run's life that higher apps (sweeps, checkpoints, parity, jobs, the MLflow API) act on, unimported.

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
- ``metrics_stored(run, steps, batch)``: a batch of ``run``'s metric points
  committed: ``steps`` maps each key of the batch to its ``(first, last)``
  step in it, ``batch`` is the batch itself (``runs.metric_batch.SortedBatch``:
  numpy columns sorted by key and step, read-only); sent after the commit, a receiver's error logged and never
  failing the batch (the parity app: the verdicts of the Run follow,
  docs/design/resume.md#parity).
- ``segment_points_stored(run, segment_id, steps)``: a batch of ``run`` committed
  points below its step floor, kept as the points of its resume segment
  ``segment_id`` (``runs.models.ResumeSegment``); ``steps`` maps each key of
  those points to its ``(first, last)`` step among them; sent after the commit
  (the parity app: that segment's blocks the batch reached are compared again,
  docs/design/resume.md#same-run-parity).
- ``parity_changed(parity, previous)``: the parity verdict of a resumed Run
  changed (``parity`` a ``parity.Parity`` row: ``run_id``, ``parent_id``,
  ``verdict``, ``step``, ``key``, ``parent_value``, ``child_value``;
  ``previous`` the verdict before); sent by the parity app after the change
  commits, here so that any app may connect to it without importing parity.
- ``checkpoint_refused(checkpoint, reason)``: a pending checkpoint ended
  ``error`` (its upload was refused, or left unfinished past its lease or its
  Run's end); ``reason`` the sentence stored on it; sent by the checkpoints
  app after the change commits.
- ``job_given_up(job, reason)``: a Job ended without running because no
  worker took it; sent by the jobs app after the change commits.
- ``checkpoint_corrupt(checkpoint, reason)``: a scrub found a complete
  checkpoint's stored bytes altered or missing and marked it ``corrupt``
  (``checkpoint`` a ``checkpoints.Checkpoint``, ``reason`` the sentence kept
  in its ``error``); sent by the checkpoints app after the change commits,
  here so that an alerting app may connect to it without importing checkpoints.
"""

from django.dispatch import Signal

run_started = Signal()
run_ended = Signal()
metrics_stored = Signal()
segment_points_stored = Signal()
parity_changed = Signal()
checkpoint_refused = Signal()
job_given_up = Signal()
checkpoint_corrupt = Signal()
