"""Errors of the worker (docs/design/house.md#where-logic-goes): why a Job cannot start, and transient infrastructure
trouble.

``PrepareError`` and its subclasses end the Job before the code starts, with
their message as the Job's error: the user's outcome, never retried
(docs/design/worker.md#refusal). ``StorageUnavailable`` is ours and transient: reads are retried with
backoff, and when they keep failing the Job fails saying so.
"""

from mado.errors import InternalError


class PrepareError(Exception):
    """The Job cannot start; ``str(exc)`` is the sentence shown on the Job."""


class CheckpointMismatch(PrepareError):
    """A checkpoint's stored bytes differ from its record: ``Checkpoint <id> <what> mismatch: <detail>``
    (docs/design/worker.md#refusal).

    ``what`` is ``artifact`` (nothing usable stored), ``tar`` (not a valid
    tar), ``path`` (unsafe or duplicate member), ``manifest`` (extra or
    missing file), ``size`` or ``sha256``.
    """

    def __init__(self, checkpoint_id, what: str, detail: str):
        super().__init__(f"Checkpoint {checkpoint_id} {what} mismatch: {detail}")
        self.checkpoint_id = checkpoint_id
        self.what = what
        self.detail = detail


class ArchiveRejected(PrepareError):
    """A Code version's source archive is unreadable or holds something unsafe (a link, ``..``, a device…)."""


class StorageUnavailable(InternalError):
    """The artifact storage could not be read after the bounded retries (transient, ours)."""
