"""What online and offline Runs share: run kinds, the run id, parameter checks, the step counter, ``with`` and
the exit hook (docs/design/resume.md#steps-continue; docs/design/sweeps.md#sweeps;
docs/design/interfaces.md#surfaces)."""

import atexit
import json
import logging
import secrets
import sys
import threading
import time
from collections.abc import Mapping

from mado_tracking import restore_check
from mado_tracking.errors import CheckpointError, MadoError
from mado_tracking.points import Point, check_metric_step, metric_points
from mado_tracking.resume import ResumeCheckpoint, resume_checkpoint
from mado_tracking.resume_fetch import starting_below

logger = logging.getLogger("mado_tracking")

RUN_KINDS = ("training", "fine_tuning", "evaluation", "other")
FINISH_STATUSES = ("finished", "failed", "aborted", "preempted")

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_open_runs: set["RunBase"] = set()
_open_runs_lock = threading.Lock()
restore_check.track_open_runs(_open_runs, _open_runs_lock)  # a checkpoint's load reports to the open Run
# An atexit hook cannot see the interpreter's exit code, so, as W&B's SDK does, sys.exit is wrapped while the
# SDK is in use and the last code given to it is kept. `raise SystemExit(n)` and os._exit() are not seen.
_NO_EXIT_CALL = object()
_exit_status = _NO_EXIT_CALL
_original_exit = None


def new_external_id() -> str:
    # Chosen here, not by the server, so a retried create cannot make a second Run (docs/design/house.md#idempotent).
    return "".join(secrets.choice(_ALPHABET) for _ in range(8))


def check_kind(kind: str) -> str:
    if kind not in RUN_KINDS:
        raise ValueError(f"kind must be one of {', '.join(RUN_KINDS)}, got {kind!r}")
    return kind


def check_parameters(parameters) -> dict:
    """``parameters`` as a JSON-able dict (None → {}); ``ValueError`` otherwise."""
    if parameters is None:
        return {}
    if not isinstance(parameters, Mapping):
        raise ValueError(f"parameters must be a dict (a JSON object), got {type(parameters).__name__}")
    parameters = dict(parameters)
    try:
        json.dumps(parameters, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"parameters must be JSON (str keys; finite numbers, str, bool, None, lists, dicts): {exc}"
        ) from None
    return parameters


def _recording_exit(status=None, /):
    """``sys.exit`` that first keeps ``status`` for the interpreter-exit hook of Runs left open.

    Only the main thread's call ends the program; another thread's only ends that thread.
    """
    global _exit_status
    if threading.current_thread() is threading.main_thread():
        _exit_status = status
    _original_exit(status)


def _record_exit_codes() -> None:
    global _original_exit
    if _original_exit is None:
        _original_exit, sys.exit = sys.exit, _recording_exit


# From the import on, not only from the first start_run: ``sys.exit(main())`` looks ``sys.exit`` up before
# ``main()`` starts its Run, and would otherwise call the unwrapped one.
_record_exit_codes()


def rank_keys(metrics: Mapping, rank: int) -> dict:
    """``metrics`` with each key under ``rank<k>/`` (``log_metrics(..., all_ranks=True)``,
    docs/design/worker.md#distributed)."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of key to number, got {type(metrics).__name__}")
    return {f"rank{rank}/{key}": value for key, value in metrics.items()}


def check_finish_status(status: str) -> str:
    if status not in FINISH_STATUSES:
        raise ValueError(f"status must be one of {', '.join(FINISH_STATUSES)}, got {status!r}")
    return status


class RunBase:
    """``with`` support, the step counter, ``resume_checkpoint`` and the interpreter-exit hook of online and
    offline Runs.

    A subclass sets ``id`` and ``step`` and implements ``finish(status)`` and
    ``mark_preempting()`` (which sets ``preempting``); it calls ``_opened()``
    once ready and ``_closed()`` when it starts finishing.
    """

    id: object = None
    offline = False
    step = 0
    preempting = False
    # under torchrun: this process's rank and the number of ranks
    # (mado_tracking.distributed, docs/design/worker.md#distributed)
    rank = 0
    world_size = 1
    # a resumed Run's latest complete checkpoint step until resume_checkpoint() is called or the warning is given
    _warn_below_step: int | None = None

    def _update(self, data: dict) -> None:
        """Take the Run's fields from the server's answer ``data`` (a subclass sets ``_config`` first)."""
        self.id: int = data["id"]
        self.external_id: str = data.get("external_id", "")
        self.url: str = data.get("url", "")
        self.project: str = data.get("project", self._config.project)
        self.name: str = data.get("name", "")
        self.kind: str = data.get("kind", "")
        self.status: str = data.get("status", "")
        self.parameters: dict = data.get("parameters") or {}

    def _encode(self, metrics, step, all_ranks: bool = False) -> list[Point]:
        """The points of a ``log_metrics`` call at ``step`` (None: ``self.step``); ``self.step`` moves past it.

        ``all_ranks``: the keys go under ``rank<k>/``. Raises ``ValueError`` /
        ``TypeError`` as ``metric_points``; ``self.step`` is unchanged then.
        A step a resumed Run logged before its stop is sent too: the server keeps it apart and compares it with the
        first points (docs/design/resume.md#same-run-parity).
        """
        restore_check.before_metrics(self, step)  # docs/design/checkpoints.md#restore-check
        if all_ranks:
            metrics = rank_keys(metrics, self.rank)
        step = check_metric_step(self.step if step is None else step)
        points = metric_points(metrics, step, time.time())
        if self._warn_below_step is not None and step < self._warn_below_step:
            starting_below(self, step, "log_metrics")
        self.step = max(self.step, step + 1)
        return points

    def _starting_below(self, step, what: str) -> None:
        """``step`` of ``what`` may be below the resumed Run's latest checkpoint: warn once
        (``mado_tracking.resume_fetch``, docs/design/resume.md#resume-anywhere)."""
        if self._warn_below_step is None or isinstance(step, bool) or not isinstance(step, int):
            return
        if step < self._warn_below_step:
            starting_below(self, step, what)

    def _ending_status(self, clean: bool) -> str:
        # docs/design/sweeps.md#sweeps: after mark_preempting, only a clean exit finishes; anything else is a
        # preemption.
        if clean:
            return "finished"
        return "preempted" if self.preempting else "failed"

    def _opened(self) -> None:
        # An uncaught exception leaves sys.last_value behind; one from before this Run is not ours.
        self._last_value_at_start = getattr(sys, "last_value", None)
        with _open_runs_lock:
            _record_exit_codes()
            _open_runs.add(self)

    def _closed(self) -> None:
        with _open_runs_lock:
            _open_runs.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        clean = exc_type is None or (exc_type is SystemExit and exc.code in (0, None))
        try:
            self.finish(self._ending_status(clean))
        except MadoError as error:
            if clean and isinstance(error, CheckpointError):
                raise  # the block succeeded but a checkpoint it saved in the background did not: no exit 0
            # Training is over either way; failing the program now would only hide its own outcome.
            logger.error("mado: finishing run %s: %s", self.id, error)
        return False

    def finish(self, status: str = "finished", *, timeout: float | None = None) -> None:
        raise NotImplementedError

    def resume_checkpoint(self) -> ResumeCheckpoint | None:
        """The checkpoint this run resumes from, or None (docs/design/resume.md#in-the-code, #resume-anywhere).

        First the ``MMT_RESUME_*`` variables (a Job's resume; see
        ``mado_tracking.resume_checkpoint``). Without them, online, on a Run
        that ``start_run`` resumed under its id: its latest ``complete``
        checkpoint (or the one ``MMT_RESUME_CHECKPOINT_ID`` names), downloaded,
        verified and extracted read-only into the SDK's cache
        (``mado_tracking.resume_fetch``; under torchrun rank 0 fetches and
        every rank gets the same directory). None otherwise. The answer is kept:
        a second call returns the same object without a request.

        Load the weights from ``.path`` and continue the loop with
        ``range(checkpoint.step, total)``: metric steps go on from there (docs/design/resume.md#steps-continue).

        Raises:
            ResumeError: the ``MMT_RESUME_*`` variables disagree, or
                ``MMT_RESUME_CHECKPOINT_ID`` is not an id of this Run's
                checkpoints (or is set on a Run that was not resumed).
            CheckpointError: the checkpoint is not complete, or its bytes
                differ from its size, SHA-256 or manifest ("Checkpoint <id>
                <what> mismatch: …"); nothing is extracted then.
            ApiError: the server refused or stayed unreachable.
            OSError: the cache directory cannot be written (``MMT_CACHE_DIR``).
        """
        with self.__dict__.setdefault("_resume_lock", threading.Lock()):
            self._warn_below_step = None
            if "_resume_found" not in self.__dict__:
                self._resume_found = self._find_resume_checkpoint()
            return self._resume_found

    def _find_resume_checkpoint(self) -> ResumeCheckpoint | None:
        return resume_checkpoint()

    def log_checkpoint_distributed(self, state_dict: dict, step: int, *, includes_optimizer: bool = False):
        """Every rank: save ``state_dict`` with ``torch.distributed.checkpoint`` as ONE Checkpoint
        (docs/design/worker.md#distributed).

        See ``mado_tracking.dcp.log_distributed`` for the steps, the result and the errors.
        """
        from mado_tracking.dcp import log_distributed

        return log_distributed(self, state_dict, step=step, includes_optimizer=includes_optimizer)

    def _save_sharded(self, directory, step: int, includes_optimizer: bool, world_size: int):
        raise MadoError(f"run {self.id}: sharded checkpoints are uploaded by rank 0 of an online run")

    def _finish_at_exit(self) -> None:
        # A program that called sys.exit: its code decides, as leaving ``with`` by it would
        # (docs/design/sweeps.md#sweeps; docs/design/interfaces.md#surfaces). Otherwise an uncaught exception fails the
        # run, and a preempting run left open ends preempted.
        if _exit_status is not _NO_EXIT_CALL:
            clean = _exit_status in (0, None)
        else:
            uncaught = getattr(sys, "last_value", None)
            clean = not self.preempting and (uncaught is None or uncaught is self._last_value_at_start)
        self.finish(self._ending_status(clean))


@atexit.register
def _finish_open_runs() -> None:
    """Finish every Run left open when the interpreter exits (metrics flushed first)."""
    with _open_runs_lock:
        runs = list(_open_runs)
    for run in runs:
        try:
            run._finish_at_exit()
        except Exception as error:  # noqa: BLE001 - exiting anyway; say why the Run stays open
            logger.error("mado: could not finish run %s at exit: %s", run.id, error)
