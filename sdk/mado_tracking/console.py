"""What a start of a Run shows on stderr (docs/design/runs.md#resume-modes): which Run the process writes to, and
the SDK's INFO lines when the program set up no logging.

On every start (``start_run``, online or offline) one line goes to stderr, as W&B's does:
``mado: run <run id> (started): <url of the Run page>``, ``(resumed at step N)`` when it continued a Run
(``N``: ``run.step``), offline the run's directory instead of the page. Under torchrun only rank 0 says it.

The ``mado_tracking`` logger carries the SDK's INFO lines (which checkpoint a resume uses, up to which step a
resumed Run's checkpoints go, which run ``resume="auto"`` picked). Python shows a logger's INFO lines only
when the program configured logging; so on the first ``start_run`` of a process, when neither the
``mado_tracking`` logger nor the root logger has a handler (the program set up no logging), a handler is
attached that writes each record's message, as is, to stderr, and the logger's level is set to INFO.
``MMT_LOG_LEVEL`` (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``, ``CRITICAL``) sets the ``mado_tracking``
logger's level instead, configured logging or not; above ``INFO`` it also silences the start line. A
program that configures logging itself (``logging.basicConfig``) gets the SDK's records through its own
handlers: the SDK's handler then stays quiet, so no line shows twice.
"""

import logging
import os
import sys

ENV_LOG_LEVEL = "MMT_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

logger = logging.getLogger("mado_tracking")

_set_up = False


class _StderrHandler(logging.Handler):
    """Writes ``%(message)s`` to the ``sys.stderr`` of the moment (a redirected stderr too), unless the root
    logger got a handler since (the program configured logging later): its handlers show the record."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def log_level_from_environment() -> int | None:
    """``MMT_LOG_LEVEL`` as a ``logging`` level (names in any case), None when unset or empty.

    Raises ``ValueError`` naming the variable for another value.
    """
    raw = os.environ.get(ENV_LOG_LEVEL, "").strip()
    if not raw:
        return None
    if raw.upper() not in LEVELS:
        raise ValueError(f"{ENV_LOG_LEVEL} must be one of {', '.join(LEVELS)}, got {raw!r}")
    return getattr(logging, raw.upper())


def is_rank_zero() -> bool:
    """False on a rank > 0 of a torchrun program (``RANK`` set and not 0), else True."""
    return os.environ.get("RANK", "").strip() in ("", "0")


def set_up_logging(level: int | None) -> None:
    """On the first call of the process: the ``mado_tracking`` logger's level and its stderr handler, as the
    module docstring says (``level``: ``log_level_from_environment()``). Later calls do nothing."""
    global _set_up
    if _set_up:
        return
    _set_up = True
    if level is not None:
        logger.setLevel(level)
    if logger.handlers or logging.getLogger().handlers or not is_rank_zero():
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.addHandler(_StderrHandler())


def announce(*, external_id: str, resumed: bool, step: int, where: str) -> None:
    """Print ``mado: run <external_id> (started|resumed at step <step>): <where>`` to stderr: rank 0 only, and
    not when ``MMT_LOG_LEVEL`` is above INFO (a bad value was refused at the start)."""
    try:
        level = log_level_from_environment()
    except ValueError:
        level = None
    if not is_rank_zero() or (level is not None and level > logging.INFO):
        return
    how = f"resumed at step {step}" if resumed else "started"
    print(f"mado: run {external_id} ({how}): {where}", file=sys.stderr, flush=True)
