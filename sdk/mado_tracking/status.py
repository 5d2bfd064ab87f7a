"""Status changes a process makes to its own Run (docs/design/sweeps.md#sweeps; docs/design/interfaces.md#surfaces): the
final status, and ``preempting``."""

import logging

from mado_tracking.client import ApiClient, Backoff
from mado_tracking.config import Config
from mado_tracking.errors import ApiError
from mado_tracking.lease import Lease

logger = logging.getLogger("mado_tracking")

PREEMPTING_ATTEMPTS = 3
PREEMPTING_TIMEOUT_S = 5.0


def set_status(
    client: ApiClient, run_id: int, status: str, *, attempts: int | None = None, lease: Lease | None = None
) -> dict | None:
    """PATCH the Run's final status; another final state already on the server is kept (warning).

    Returns the Run's JSON, or None when ``lease`` says the Run was lost (another process holds it).
    ``attempts`` bounds the tries (None: until ``MMT_RETRY_TIMEOUT`` seconds passed).
    Raises ``ApiError`` when the server refused otherwise or stayed unreachable.
    """
    try:
        return client.request("PATCH", f"runs/{run_id}/", body={"status": status}, attempts=attempts)
    except ApiError as error:
        if lease is not None and lease.lost_by(error):
            return None
        if error.status != 409:
            raise
        data = client.request("GET", f"runs/{run_id}/", attempts=attempts)
        logger.warning(
            "mado: run %s already ended as %s on the server; not marked %s", run_id, data.get("status"), status
        )
        return data


def set_preempting(config: Config, lease: Lease, run_id: int) -> dict | None:
    """PATCH the Run to ``preempting``: a few quick tries on a connection of its own; never raises.

    Its own connection because a signal handler may interrupt the main thread
    in the middle of a request of the Run's client. Returns the Run's JSON, or
    None when the server was not told (a warning says why, unless the Run was lost).
    """
    client = ApiClient(config, read_timeout=PREEMPTING_TIMEOUT_S, headers=lease.headers)
    try:
        return client.request(
            "PATCH",
            f"runs/{run_id}/",
            body={"status": "preempting"},
            attempts=PREEMPTING_ATTEMPTS,
            backoff=Backoff(0.2, 1.0),
        )
    except ApiError as error:
        if not lease.lost_by(error):
            logger.warning(
                "mado: could not mark run %s preempting (%s); it still ends preempted unless the program exits cleanly",
                lease.run_label,
                error,
            )
        return None
    finally:
        client.close()
