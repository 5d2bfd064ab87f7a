"""A Job with several processes: its code under ``torchrun`` and each rank's exit (docs/design/worker.md#distributed;
docs/jobs.md).

When ``job.nproc_per_node`` is above 1 the worker starts ``python -m
torch.distributed.run --standalone --nproc-per-node N <entrypoint>`` with the
entrypoint's own interpreter (an entrypoint that is no Python program runs
through ``torchrun --no-python``). The checkpoint was restored once, before,
read-only, for every rank. torchrun's processes stay in the code's process
group, so an abort stops all of them (``worker.runner``). When it fails,
torchrun prints one report per failed rank (rank, local rank, exit code);
``RankExits`` reads them back from the log for the Job's error.
"""

import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

TORCHRUN_MODULE = "torch.distributed.run"
PYTHON_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})
TAIL_BYTES = 64 * 1024  # torchrun's failure report is the last thing it prints
_REPORT = re.compile(
    r"^\s*rank\s*:\s*(?P<rank>\d{1,9})\s*\(local_rank:\s*(?P<local>\d{1,9})\)\s*\n"
    r"\s*exitcode\s*:\s*(?P<code>-?\d{1,9})\b(?:\s*\(pid:\s*\d+\))?[ \t]*(?P<signal>\([A-Z0-9]{1,20}\))?",
    re.MULTILINE,
)
_ROOT_CAUSE = "Root Cause (first observed failure):"


def torchrun_argv(
    entrypoint: list[str], nproc_per_node: int, *, rendezvous: Sequence[str] = ("--standalone",)
) -> list[str]:
    """``entrypoint`` (an argv list) under torchrun with ``nproc_per_node`` processes on this machine.

    ``["python", "-u", "train.py", "--lr", "1"]`` → ``["python", "-u", "-m",
    "torch.distributed.run", "--standalone", "--nproc-per-node", "N",
    "train.py", "--lr", "1"]``: the interpreter's own options stay before
    ``-m``; ``python -m package`` becomes torchrun's ``-m package``.
    ``rendezvous``: torchrun's options that say where the processes meet
    (default one machine, ``--standalone``; the Kubernetes runner gives
    ``--nnodes`` and the master's address, docs/design/worker.md#distributed).
    """
    launcher = [*rendezvous, "--nproc-per-node", str(nproc_per_node)]
    program, rest = entrypoint[0], list(entrypoint[1:])
    if not Path(program).name.startswith("python"):
        return ["torchrun", *launcher, "--no-python", *entrypoint]
    options = []
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        option = rest.pop(0)
        options.append(option)
        if option in PYTHON_OPTIONS_WITH_VALUE and rest:
            options.append(rest.pop(0))
    return [program, *options, "-m", TORCHRUN_MODULE, *launcher, *rest]


class RankExit(NamedTuple):
    rank: int
    local_rank: int
    exit_code: int
    signal: str
    first: bool


class RankExits:
    """Keeps the last ``TAIL_BYTES`` of the code's output; ``summary()`` names each failed rank's exit."""

    def __init__(self):
        self._tail = ""

    def feed(self, text: str) -> None:
        self._tail = (self._tail + text)[-TAIL_BYTES:]

    def exits(self) -> list[RankExit]:
        """The ranks torchrun reported, the first failure first (empty when it printed no report)."""
        root = self._tail.rfind(_ROOT_CAUSE)
        found = []
        for match in _REPORT.finditer(self._tail):
            found.append(
                RankExit(
                    int(match["rank"]),
                    int(match["local"]),
                    int(match["code"]),
                    (match["signal"] or "").strip("()"),
                    root != -1 and match.start() > root,
                )
            )
        return sorted(found, key=lambda exit_: (not exit_.first, exit_.rank))

    def summary(self, nproc_per_node: int, exit_code: int | None) -> str:
        """One line for the Job's error: torchrun's exit code and every rank it reported."""
        parts = []
        for item in self.exits():
            how = f"was stopped by {item.signal}" if item.signal else f"exited with code {item.exit_code}"
            parts.append(
                f"rank {item.rank} (local rank {item.local_rank}) {how}" + (" (first failure)" if item.first else "")
            )
        detail = "; ".join(parts) if parts else "no rank report in the log"
        return f"torchrun ({nproc_per_node} processes) exited with code {exit_code}: {detail}."
