"""What a resumed run failed to restore from its checkpoint, said before its first step
(docs/design/checkpoints.md#restore-check).

``mado_tracking.torch.load_checkpoint`` (or a framework integration) calls
``after_load`` with one status per part of the training state the checkpoint
holds: ``restored``, ``not_restored`` (with a one-line detail) or ``unknown``,
or ``not_declared`` for a part the checkpoint cannot describe (its detail
names the call that declares it), and the checks to repeat at the run's
first optimizer step or ``log_metrics`` ("late" checks: a value changed
after the load, a scheduler rebuilt, an RNG re-seeded, a data loader
restarted after the load). The SDK then

- writes one WARNING line naming each part not restored, and one naming
  each part not declared, to the process output (a Job's log), at the load
  and again at the first metrics when the late checks found more;
- sends the report to the server, ``POST runs/{id}/restore-report/`` (once
  a Run is open; again at the first metrics when something changed), before
  the first metrics of the run are queued. Offline, or on ranks other than 0,
  nothing is sent.

Only a resuming process reports: ``MMT_RESUME_*`` set (a Job's resume or
continue) or a Run started under an id it resumes. A resuming process that
logs metrics without having loaded any checkpoint through mado_tracking gets one
warning:

- a Job's resume (``MMT_RESUME_*``) from a checkpoint saved by
  ``mado_tracking.torch`` sends nothing: the server's "resume ignored?" signal
  (no report for a checkpoint holding a training state) covers it, and a report
  would clear that signal;
- a same-run resume whose ``run.resume_checkpoint()`` fetched a checkpoint
  holding a training state (in its ``mado-checkpoint.json`` or its metadata)
  sends a report marking every part it holds ``unknown``
  (``NOT_LOADED_DETAIL``): a same-run resume has no "resume ignored?" signal,
  and its resume segment shows the report
  (docs/design/resume.md#same-run-parity).
"""

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mado_tracking import probe_stop
from mado_tracking.errors import ApiError, ResumeError
from mado_tracking.resume import resume_checkpoint

logger = logging.getLogger("mado_tracking")

RESTORED, NOT_RESTORED, UNKNOWN, NOT_DECLARED = "restored", "not_restored", "unknown", "not_declared"
STATUSES = (RESTORED, NOT_RESTORED, UNKNOWN, NOT_DECLARED)
INFO_FILE = "mado-checkpoint.json"
PARTS_MAX = 128  # what one report may hold (docs/api.md)
DETAIL_MAX = 500
_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# the part names the server takes (parity/services/restore.py), generator names before _part_name cleans them
_REPORTED_PART = re.compile(
    r"(?:model|optimizer|scheduler|scaler)(?:\.[0-9]{1,3})?|rng\.(?:python|numpy|torch)|rng\.cuda\.[0-9]{1,4}"
    r"|generator\..+|data_position|global_step"
)
NOT_LOADED_DETAIL = (
    "the checkpoint fetched by resume_checkpoint() was not loaded through mado_tracking (load_checkpoint, "
    "MadoCallback, MadoResume, the Accelerate helper): what was restored is not known"
)
NOT_FETCHED_DETAIL = (
    "the run was resumed under its id but neither called resume_checkpoint() nor loaded a checkpoint through "
    "mado_tracking (load_checkpoint, MadoCallback, MadoResume, the Accelerate helper): what was restored is not known"
)

Outcome = dict[str, tuple[str, str]]  # part → (status, one-line detail)
LateCheck = Callable[[int | None], Outcome]  # given the first metrics' step


@dataclass
class RestoreCheck:
    """One load of a checkpoint by a resuming process: ``parts`` (``{part: (status, detail)}``), the ``late`` checks
    still to run at the first metrics, what was warned about and sent."""

    directory: Path
    step: int
    checkpoint_id: int | None
    parts: Outcome
    late: list[LateCheck] = field(default_factory=list)
    warned: set = field(default_factory=set)
    sent: dict | None = None
    send_refused: bool = False

    def not_restored(self) -> list[str]:
        return self.having(NOT_RESTORED)

    def having(self, wanted: str) -> list[str]:
        """The parts whose status is ``wanted``, in the report's order."""
        return [part for part, (status, _detail) in self.parts.items() if status == wanted]

    def body(self) -> dict:
        """The ``POST runs/{id}/restore-report/`` body: at most ``PARTS_MAX`` parts (those not restored first),
        generator names in the characters the server takes, one-line details of at most ``DETAIL_MAX``
        characters."""
        ranked = sorted(self.parts.items(), key=lambda item: item[1][0] == RESTORED)[:PARTS_MAX]
        named = {_part_name(part): outcome for part, outcome in ranked}
        return {
            "checkpoint_id": self.checkpoint_id,
            "parts": {part: status for part, (status, _detail) in named.items()},
            "details": {part: _one_line(detail) for part, (_status, detail) in named.items() if detail},
        }


def _part_name(part: str) -> str:
    if not part.startswith("generator."):
        return part
    return "generator." + (_NAME_CHARACTERS.sub("_", part.split(".", 1)[1])[:100] or "_")


def _one_line(text: str) -> str:
    text = _CONTROL.sub(" ", text)
    return text if len(text) <= DETAIL_MAX else text[: DETAIL_MAX - 1] + "…"


_lock = threading.Lock()
_pending: RestoreCheck | None = None
_loaded = False  # a checkpoint was loaded in this process (reported or not)
_idle = False  # nothing left for before_metrics to do until the next load
_open_runs: tuple | None = None  # (set of open Runs, its lock), from track_open_runs


def resuming_from(directory) -> tuple[bool, int | None]:
    """``(resuming, checkpoint id)`` for a load of ``directory``: resuming when ``MMT_RESUME_CHECKPOINT_DIR`` names
    it (the id from ``MMT_RESUME_CHECKPOINT_FILE``) or the open Run was resumed under its id (id unknown)."""
    try:
        checkpoint = resume_checkpoint()
    except ResumeError:
        checkpoint = None
    if checkpoint is not None and _same_path(checkpoint.path, directory):
        return True, _checkpoint_id(checkpoint)
    run = _open_run()
    if run is None:
        return False, None
    fetched = run.__dict__.get(
        "_resume_found"
    )  # a same-run resume's checkpoint (docs/design/resume.md#resume-anywhere)
    if fetched is not None and _same_path(fetched.path, directory):
        return True, _checkpoint_id(fetched)
    return bool(getattr(run, "resumed", False)), None


def _checkpoint_id(checkpoint) -> int | None:
    found = checkpoint.id
    return found if isinstance(found, int) and not isinstance(found, bool) and found > 0 else None


def _same_path(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def after_load(*, directory, step: int, parts: Outcome, late: list[LateCheck] | None = None) -> RestoreCheck | None:
    """Record what a load restored; warn and report when the process is resuming (module docstring).

    ``parts``: ``{part: (status, detail)}``, status one of ``STATUSES``
    (``ValueError`` otherwise); ``late``: checks run once at the first
    ``log_metrics`` (each gets that call's step and returns the parts whose
    status it changes). Returns the check, or None when not resuming. Never
    raises for the server: a report that cannot be sent is a warning.
    """
    global _pending, _loaded, _idle
    for part, (status, _detail) in parts.items():
        if status not in STATUSES:
            raise ValueError(f"restore status of {part!r} must be one of {', '.join(STATUSES)}, got {status!r}")
    resuming, checkpoint_id = resuming_from(directory)
    with _lock:
        _loaded, _idle = True, False
        if not resuming:
            _pending = None
            return None
        check = RestoreCheck(
            directory=Path(directory), step=step, checkpoint_id=checkpoint_id, parts=dict(parts), late=list(late or [])
        )
        _pending = check
    _warn(check)
    run = _open_run()
    if run is not None:
        _send(check, run)
    return check


def mark(part: str, status: str, detail: str = "") -> None:
    """Change one part's status in the pending check (e.g. the data position read with ``load_data_position``); it
    is sent at the first metrics."""
    with _lock:
        if _pending is not None and part in _pending.parts:
            _pending.parts[part] = (status, detail)


def before_metrics(run, step) -> None:
    """Called by every ``log_metrics`` before its points are queued: the probe's stop (``probe_stop``), then, once,
    the late checks of the pending load and the updated report (or the warning of a resumed run that loaded
    nothing)."""
    probe_stop.check(run, step)
    if _idle:
        return
    _first_metrics(run, run.step if step is None else step)


def _first_metrics(run, step) -> None:
    global _pending, _idle
    with _lock:
        if _idle:
            return
        check, _pending, _idle = _pending, None, True
        loaded = _loaded
    if check is None:
        if not loaded:
            _warn_nothing_loaded(run)
        return
    for late in check.late:
        try:
            changes = late(step if isinstance(step, int) else None)
        except Exception as error:  # noqa: BLE001 - a check must never stop training
            logger.debug("mado: a restore check failed: %s", error)
            continue
        for part, outcome in changes.items():
            if check.parts.get(part, (RESTORED,))[0] == RESTORED:
                check.parts[part] = outcome
    _warn(check)
    _send(check, run)


def _warn(check: RestoreCheck) -> None:
    where = f"checkpoint {check.checkpoint_id}" if check.checkpoint_id is not None else str(check.directory)
    for status, line in (
        (NOT_RESTORED, "not restored from %s (step %d): %s. The run will not continue as an uninterrupted one would."),
        (NOT_DECLARED, "not declared in %s (step %d): %s. mado cannot check that part of the resume."),
    ):
        fresh = [part for part in check.having(status) if (part, status) not in check.warned]
        if fresh:
            check.warned.update((part, status) for part in fresh)
            listed = "; ".join(f"{part} — {check.parts[part][1]}" if check.parts[part][1] else part for part in fresh)
            logger.warning("mado: WARNING: " + line, where, check.step, listed)


def _warn_nothing_loaded(run) -> None:
    try:
        checkpoint = resume_checkpoint()
    except ResumeError:
        return
    if checkpoint is None:
        _report_fetched_not_loaded(run)
        return
    if not _saved_by_mado(checkpoint.path):
        return
    logger.warning(
        "mado: WARNING: run %s resumes from checkpoint %s (step %d) but loaded no checkpoint with "
        "mado_tracking.torch.load_checkpoint before its first metrics: what was restored is not checked.",
        getattr(run, "external_id", None) or run.id,
        checkpoint.id,
        checkpoint.step,
    )


def _report_fetched_not_loaded(run) -> None:
    """A Run resumed under its id that logs metrics without loading anything through mado_tracking, from a
    checkpoint holding a training state (the one ``run.resume_checkpoint()`` fetched, else its latest complete one
    when it was never called): one warning, and a report marking every part the checkpoint holds ``unknown``
    (docs/design/checkpoints.md#restore-check)."""
    fetched = run.__dict__.get("_resume_found")
    latest = getattr(run.__dict__.get("_resume_plan"), "latest", None)
    if fetched is not None:
        checkpoint_id, step, detail = _checkpoint_id(fetched), fetched.step, NOT_LOADED_DETAIL
        info = _info(fetched.path)
        state = info.get("training_state") if isinstance(info, dict) else None
        directory = Path(fetched.path)
        fetched_by = ", fetched by run.resume_checkpoint(),"
    elif "_resume_found" not in run.__dict__ and getattr(run, "resumed", False) and isinstance(latest, dict):
        checkpoint_id, step, detail, state = latest.get("id"), latest.get("step"), NOT_FETCHED_DETAIL, None
        directory, fetched_by = Path("."), " (its latest, never fetched: run.resume_checkpoint() was not called)"
    else:
        return
    if not isinstance(state, dict) and isinstance(latest, dict) and latest.get("id") == checkpoint_id:
        metadata = latest.get("metadata")
        state = metadata.get("training_state") if isinstance(metadata, dict) else None
    parts = state.get("parts") if isinstance(state, dict) else None
    held = (
        [part for part in parts if isinstance(part, str) and _REPORTED_PART.fullmatch(part)]
        if isinstance(parts, dict)
        else []
    )
    if not held or not isinstance(step, int):
        return
    logger.warning(
        "mado: WARNING: run %s resumes from checkpoint %s (step %d)%s but loaded no checkpoint with "
        "mado_tracking.torch.load_checkpoint (nor MadoCallback, MadoResume, the Accelerate helper) before its "
        "first metrics: what was restored is not known; its restore report marks the checkpoint's parts unknown.",
        getattr(run, "external_id", None) or run.id,
        checkpoint_id,
        step,
        fetched_by,
    )
    check = RestoreCheck(
        directory=directory,
        step=step,
        checkpoint_id=checkpoint_id if isinstance(checkpoint_id, int) and checkpoint_id > 0 else None,
        parts={part: (UNKNOWN, detail) for part in held},
    )
    _send(check, run)


def _info(directory):
    try:
        return json.loads((Path(directory) / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _saved_by_mado(directory) -> bool:
    info = _info(directory)
    return isinstance(info, dict) and isinstance(info.get("files"), dict)


def track_open_runs(runs: set, lock) -> None:
    """Where the Runs open in this process are (``mado_tracking._base`` gives its set and lock at import): a load
    reports to the one open Run."""
    global _open_runs
    _open_runs = (runs, lock)


def _open_run():
    """The one Run open in this process, or None (none, or several)."""
    if _open_runs is None:
        return None
    runs, lock = _open_runs
    with lock:
        found = list(runs)
    return found[0] if len(found) == 1 else None


def _send(check: RestoreCheck, run) -> None:
    client = getattr(run, "_client", None)
    if client is None or getattr(run, "offline", False) or getattr(run, "rank", 0) != 0 or check.send_refused:
        return
    if getattr(run, "lost", False) or getattr(run, "_finishing", False):
        return
    body = check.body()
    if body == check.sent:
        return
    try:
        _post(client, run, body)
    except ApiError as error:
        if error.status in (404, 405):  # a server that keeps no restore reports
            check.send_refused = True
            logger.debug("mado: the server keeps no restore reports (%s)", error)
            return
        lease = getattr(run, "_lease", None)
        if lease is not None:
            lease.lost_by(error)
        logger.warning("mado: the restore report of run %s was not sent: %s", run.id, error)
        return
    check.sent = body


def _post(client, run, body: dict) -> None:
    """POST the report; a server that predates ``not_declared`` (400 on ``parts.<part>``) gets those parts as
    ``unknown``, their details kept."""
    try:
        client.request("POST", f"runs/{run.id}/restore-report/", body=body, attempts=3)
    except ApiError as error:
        if (
            error.status != 400
            or not (error.field or "").startswith("parts.")
            or NOT_DECLARED not in body["parts"].values()
        ):
            raise
        parts = {part: UNKNOWN if status == NOT_DECLARED else status for part, status in body["parts"].items()}
        client.request("POST", f"runs/{run.id}/restore-report/", body={**body, "parts": parts}, attempts=3)


def reset() -> None:
    """Forget every load of this process (for tests)."""
    global _pending, _loaded, _idle
    with _lock:
        _pending, _loaded, _idle = None, False, False
