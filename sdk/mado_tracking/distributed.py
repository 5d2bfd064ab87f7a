"""One Run for every rank of a ``torchrun`` program (docs/design/worker.md#distributed).

Under ``torchrun`` (``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set, world
size above 1) ``start_run`` on every rank joins ONE Run: rank 0 starts or
resumes it as a single process would (write lease, heartbeats, final status),
then leaves what the server answered in the process group's key-value store
for the other ranks, so call ``torch.distributed.init_process_group`` first.
Rank 0 never waits for the others: a program that starts its Run on rank 0
only keeps working (then every ``start_run`` must be rank 0's alone; the
N-th ``start_run`` of each rank joins the N-th of rank 0). Every other rank gets a
``RankRun``: the same ``id``, ``external_id`` and ``step``, no heartbeat and
no status of its own. Metrics come from rank 0 unless
``log_metrics(..., all_ranks=True)``, which stores each rank's series under
``rank<k>/`` keys (rank 0's too). When one rank crashes torchrun stops the
others; the Run then ends ``failed`` through its Job (the worker reports
torchrun's exit) or, outside a Job, ``crashed`` once its heartbeats stop
(docs/design/runs.md#liveness). Sharded checkpoints: ``mado_tracking.dcp``.
"""

import itertools
import json
import logging
from collections.abc import Callable, Mapping

from mado_tracking import config as config_module
from mado_tracking._base import RunBase, check_finish_status, rank_keys
from mado_tracking.errors import MadoError
from mado_tracking.lease import DEFAULT_HEARTBEAT_INTERVAL_S, Lease
from mado_tracking.metrics import MetricSender
from mado_tracking.ranks import Ranks, process_group_ranks, ranks_from_environment
from mado_tracking.resume_fetch import for_rank

logger = logging.getLogger("mado_tracking")

__all__ = ["RankRun", "Ranks", "join_run", "rank_keys", "ranks_from_environment"]

_START_KEY = "mado_tracking/start_run/{}"
_starts = itertools.count()  # the N-th start_run of this process reads rank 0's N-th


def _share_start(value: dict | None, rank: int) -> dict:
    """Rank 0's ``value`` on this rank, through the default process group's store (rank 0 does not wait)."""
    import torch.distributed.distributed_c10d as c10d

    key = _START_KEY.format(next(_starts))
    store = c10d._get_default_store()
    if rank == 0:
        store.set(key, json.dumps(value))
        return value
    return json.loads(store.get(key))  # waits for rank 0 up to the process group's timeout


def join_run(
    ranks: Ranks, start: Callable[[], RunBase], config: Callable[[], config_module.Config], flush_timeout: float
):
    """Rank 0: ``start()`` and share the Run with the others; rank k > 0: a ``RankRun`` of that Run.

    Every rank raises when rank 0 could not start the Run (``MadoError`` on
    the others, naming rank 0's error), so no rank waits for a Run that
    never comes.
    """
    process_group_ranks(ranks)
    if ranks.rank == 0:
        try:
            run = start()
        except BaseException as error:
            _share_start({"error": f"{type(error).__name__}: {error}"}, 0)
            raise
        run.rank, run.world_size = 0, ranks.world_size
        _share_start({"data": run.shared_data(), "step": run.step}, 0)
        return run
    shared = _share_start(None, ranks.rank)
    if "error" in shared:
        raise MadoError(f"rank {ranks.rank}: rank 0 could not start the run: {shared['error']}")
    return RankRun(config=config(), data=shared["data"], step=shared["step"], ranks=ranks, flush_timeout=flush_timeout)


class RankRun(RunBase):
    """The Run as rank k > 0 of a torchrun program sees it (rank 0 holds the ``Run``;
    docs/design/worker.md#distributed).

    Same attributes as ``Run`` (``id``, ``external_id``, ``url``, ``project``,
    ``name``, ``kind``, ``parameters``, ``step``, ``resumed``, ``rank``,
    ``world_size``). It sends only ``log_metrics(..., all_ranks=True)``
    points (with rank 0's fencing token, so a Run taken over refuses them
    too), never heartbeats or a status: ``finish`` only flushes its points.
    """

    def __init__(self, *, config: config_module.Config, data: dict, step: int, ranks: Ranks, flush_timeout: float):
        self._config = config
        self._shared = data
        self._update(data)
        self.resumed = bool(data.get("resumed"))
        self.resume_count = data.get("resume_count") or 0
        self.fencing_token = data.get("fencing_token")
        self.step = step
        self.rank, self.world_size = ranks.rank, ranks.world_size
        self._flush_timeout = flush_timeout
        self._finishing = False
        self._lease = Lease(
            run_label=self.external_id or str(self.id),
            token=self.fencing_token,
            heartbeat_interval=DEFAULT_HEARTBEAT_INTERVAL_S,
        )
        self._sender = MetricSender(config, self.id, lease=self._lease)
        self._opened()

    def __repr__(self) -> str:
        return f"<RankRun {self.id} {self.external_id} rank {self.rank}/{self.world_size}>"

    @property
    def lost(self) -> bool:
        """True once the server refused this rank's points (the Run was taken over or ended)."""
        return self._lease.lost

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None, *, all_ranks: bool = False) -> None:
        """As ``Run.log_metrics``; only ``all_ranks=True`` sends (under ``rank<k>/`` keys), else only ``step`` moves.

        Raises ``ValueError`` / ``TypeError`` for a bad key, value or step
        (checked on every rank, so a bug shows on the rank that has it), and
        ``MadoError`` after ``finish``.
        """
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_metrics must come before finish()")
        points = self._encode(metrics, step, all_ranks)
        if all_ranks and not self._lease.lost:
            self._sender.add(points)

    def _find_resume_checkpoint(self):
        return for_rank(self)

    def log_checkpoint(self, *args, **kwargs):
        """Refused: rank 0 saves plain checkpoints; every rank calls ``log_checkpoint_distributed``
        (docs/design/worker.md#distributed)."""
        raise MadoError(
            f"rank {self.rank}: only rank 0 saves a checkpoint with log_checkpoint; for a sharded "
            "checkpoint every rank calls run.log_checkpoint_distributed(state_dict, step=...)"
        )

    def mark_preempting(self) -> None:
        """Rank 0 tells the server; here it only makes a failing exit a preemption for this handle."""
        self.preempting = True

    def finish(self, status: str = "finished", *, timeout: float | None = None) -> None:
        """Send this rank's queued points (at most ``timeout`` s, default ``flush_timeout``); the status is rank 0's.

        Raises ``ValueError`` for an unknown ``status``. Calling it again does nothing.
        """
        check_finish_status(status)
        if self._finishing:
            return
        self._finishing = True
        self._closed()
        unsent = self._sender.close(self._flush_timeout if timeout is None else timeout)
        if unsent and not self._lease.lost:
            logger.warning("mado: rank %d: %d metric points of run %s could not be sent", self.rank, unsent, self.id)
