"""Background checkpoint uploads of one Run: a bounded queue and one thread
(docs/design/checkpoints.md#save-and-restore).

``BackgroundUploads.submit`` hands a staged snapshot to the upload thread
and returns a ``concurrent.futures.Future`` of its ``SavedCheckpoint``. At
most ``max_pending`` checkpoints are staged or uploading at once
(``MMT_CHECKPOINT_QUEUE``, default 2), so the staging directory holds at most
that many snapshots: ``reserve`` blocks while the queue is full and says so
in a log line. A failed upload is logged when it happens and ``close`` returns
it with the others so ``finish`` reports it; nothing fails silently. The
snapshot of an upload that broke (server unreachable through the retries,
the Run taken over) stays staged for the next start of the run; one the
server refused (``CheckpointError``) is removed, as sending it again would
be refused again. Once the process is exiting (the end of the program,
``sys.exit``, a stop signal's exit) no upload starts, and one that the exit
cut short ends with ``EXITING``: its snapshot stays staged too.
"""

import logging
import os
import queue
import threading
from concurrent.futures import Future

from tqdm import tqdm

from mado_tracking.errors import CheckpointError, MadoError
from mado_tracking.staging import StagedCheckpoint
from mado_tracking.threads import leave_program_signals_to_main_thread

logger = logging.getLogger("mado_tracking")

ENV_QUEUE = "MMT_CHECKPOINT_QUEUE"
DEFAULT_MAX_PENDING = 2
EXITING = "the process is exiting: the checkpoint is left pending and the next start of the Run uploads it"


def process_exiting() -> bool:
    """True once the interpreter began to exit (the main thread ended: the end of the program, ``sys.exit``, a stop
    signal's exit), when Python runs no new thread pool work ("cannot schedule new futures after interpreter
    shutdown"), so an upload could not finish (docs/design/checkpoints.md#save-and-restore)."""
    return not threading.main_thread().is_alive()


def max_pending_from_environment() -> int:
    """``MMT_CHECKPOINT_QUEUE`` as an int >= 1 (default 2); ``ValueError`` naming the variable otherwise."""
    raw = os.environ.get(ENV_QUEUE, "").strip()
    if not raw:
        return DEFAULT_MAX_PENDING
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_QUEUE} must be a whole number >= 1 (checkpoints uploading at once), got {raw!r}")
    return value


class BackgroundUploads:
    """The upload thread of one Run; ``upload(staged)`` is the blocking upload, called on that thread."""

    def __init__(self, upload, *, max_pending: int, label: str):
        self._upload = upload
        self._label = label
        self.max_pending = max_pending
        self._slots = threading.BoundedSemaphore(max_pending)
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._futures: list[tuple[int, Future]] = []  # (step, its save)
        self._thread = threading.Thread(target=self._work, name=f"mado-checkpoint-uploads-{label}", daemon=True)
        self._thread.start()

    def reserve(self, step: int) -> None:
        """Take a place in the queue for a checkpoint at ``step``; blocks (with a log line) while it is full."""
        if self._slots.acquire(blocking=False):
            return
        logger.warning(
            "mado: %d checkpoint uploads of run %s are pending (at most %d, %s); saving step %s "
            "waits for one to finish",
            self.max_pending,
            self._label,
            self.max_pending,
            ENV_QUEUE,
            step,
        )
        self._slots.acquire()

    def release(self) -> None:
        """Give back a place taken by ``reserve`` that ``submit`` will not use (the snapshot failed)."""
        self._slots.release()

    def submit(self, staged: StagedCheckpoint, *, reserved: bool = True) -> Future:
        """Queue ``staged`` for upload; the ``Future`` of its ``SavedCheckpoint``.

        ``reserved``: a place was taken by ``reserve`` (given back when the
        upload ends); False for a snapshot already on disk (one an earlier
        process left), which takes no place.
        """
        future: Future = Future()
        with self._lock:
            self._futures.append((staged.step, future))
        self._queue.put((staged, future, reserved))
        return future

    @property
    def pending(self) -> int:
        """Checkpoints queued or uploading."""
        with self._lock:
            return sum(not future.done() for _, future in self._futures)

    def _work(self) -> None:
        leave_program_signals_to_main_thread()
        while True:
            item = self._queue.get()
            if item is None:
                return
            staged, future, reserved = item
            if future.set_running_or_notify_cancel():
                self._run(staged, future)
            if reserved:
                self._slots.release()

    def _run(self, staged: StagedCheckpoint, future: Future) -> None:
        if process_exiting():  # none started now could end: the next start sends it whole, not half of it now
            self._left_pending(staged, future, None)
            return
        try:
            saved = self._upload(staged)
        except CheckpointError as error:  # refused: sending it again would be refused again
            staged.discard()
            logger.error("mado: the checkpoint of run %s at step %s was not saved: %s", self._label, staged.step, error)
            future.set_exception(error)
        except BaseException as error:  # noqa: BLE001 - handed to the caller through the future
            if isinstance(error, RuntimeError) and process_exiting():  # the exit refused the upload's thread pools
                self._left_pending(staged, future, error)
                return
            logger.error(
                "mado: uploading the checkpoint of run %s at step %s failed: %s; its snapshot stays in %s "
                "and is uploaded when this run starts again",
                self._label,
                staged.step,
                error,
                staged.directory,
            )
            future.set_exception(error)
        else:
            staged.discard()
            future.set_result(saved)

    def _left_pending(self, staged: StagedCheckpoint, future: Future, cause: BaseException | None) -> None:
        logger.warning(
            "mado: run %s, checkpoint at step %s (snapshot %s): %s", self._label, staged.step, staged.directory, EXITING
        )
        error = MadoError(EXITING)
        error.__cause__ = cause
        future.set_exception(error)

    def close(self, *, show_progress: bool) -> list[tuple[int, Future]]:
        """Wait for every queued upload (a tqdm bar of checkpoints when ``show_progress``); ``[(step, future)]``.

        A ``KeyboardInterrupt`` stops the wait: what is not uploaded stays
        staged for the next start of the run.
        """
        with self._lock:
            futures = list(self._futures)
        self._queue.put(None)
        waiting = [future for _, future in futures if not future.done()]
        with tqdm(
            total=len(futures),
            initial=len(futures) - len(waiting),
            unit="checkpoint",
            desc=f"run {self._label}: checkpoint uploads",
            disable=not show_progress or not waiting,
        ) as bar:
            for future in waiting:
                try:
                    future.exception()
                finally:
                    bar.update(1)
        self._thread.join()
        return futures
