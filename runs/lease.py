"""The single-writer lease of a Run (docs/design/runs.md#one-writer-process): fencing tokens checked on every write of
the SDK.

Every start or resume of a Run through the SDK takes a new fencing token
(``Run.lease_token`` + 1) and sends it back with each write in the
``Mado-Fencing-Token`` header. A write carrying an older token comes from a
process that another one took over: it is refused with ``LeaseLost`` (409,
``"error": "lease_lost"``) and nothing of it is stored. A write without the
header (the MLflow client, a plain API call) is not fenced.
"""

from django.db import transaction

from mado.api import request_int
from mado.errors import LeaseLost
from runs.models import Run

FENCING_HEADER = "Mado-Fencing-Token"


def fencing_token(request) -> int | None:
    """The request's ``Mado-Fencing-Token`` header as an int, or None when absent.

    Raises ``ValidationFailed`` naming the header when it is not an integer >= 0.
    """
    return request_int(request.headers.get(FENCING_HEADER), FENCING_HEADER)


def lease_check(*, run_id: int, token: int | None) -> None:
    """Refuse a write to Run ``run_id`` that carries a stale fencing ``token`` (None: not fenced).

    Must run inside the transaction that writes: the Run's row is locked
    (``SELECT … FOR UPDATE``), so a concurrent takeover, which updates that
    row, waits for this write to commit or sees it refused. Raises
    ``LeaseLost`` naming the current writer when ``token`` differs from
    ``Run.lease_token``.
    """
    if token is None:
        return
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lease_check must run inside the writing transaction")
    current = (
        Run.objects.select_for_update().filter(pk=run_id).values("lease_token", "writer_host", "writer_pid").first()
    )
    refuse_stale_token(run_id=run_id, token=token, current=current)


def refuse_stale_token(*, run_id: int, token: int, current: dict | None) -> None:
    """Raise ``LeaseLost`` when ``token`` is not the current one: ``current`` is the Run's ``lease_token``,
    ``writer_host`` and ``writer_pid`` as read under its row lock (None: the Run is gone, nothing to refuse)."""
    if current is None or current["lease_token"] == token:
        return
    holder = f"{current['writer_host'] or 'another host'} (pid {current['writer_pid']})"
    raise LeaseLost(
        f"run {run_id} was taken over by another process on {holder}: this process's fencing token {token} "
        f"is stale (current {current['lease_token']}); nothing was written",
        field=FENCING_HEADER,
    )
