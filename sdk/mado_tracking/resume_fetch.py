"""A same-run resume brings its checkpoint (docs/design/resume.md#resume-anywhere, #in-the-code).

When ``start_run(id=..., resume="must"|"allow"|"auto")`` resumed a Run that
already existed (the server answered ``resumed``), ``run.resume_checkpoint()``
without any ``MMT_RESUME_*`` variable returns the Run's latest ``complete``
checkpoint, downloaded, verified and extracted into the SDK's cache
(``mado_tracking.checkpoint_cache``). ``MMT_RESUME_CHECKPOINT_ID`` may name
that checkpoint; one older than it is refused (a Run cannot go back: its later
steps and checkpoints stay recorded), the message saying how to branch from it
in a new Run; a bad value is refused by ``start_run`` before any request. The
three ``MMT_RESUME_*`` variables of a Job still win. Newer checkpoints that are pending, refused (``error``) or
deleted are passed over with one warning each.

At the start of a resumed Run the SDK lists its checkpoints once
(``GET runs/{id}/checkpoints/?all=1``) and says in an INFO line up to which
step they go. A process that then logs or saves a step below the latest
complete checkpoint without having called ``resume_checkpoint()`` (it starts
over from 0) is told once, by a warning at that call, before the server drops
its points or refuses the checkpoint: one integer comparison per call, no
request.

Under torchrun (``mado_tracking.distributed``) rank 0 finds the checkpoint and
leaves its answer (path, step, id, what identifies its bytes (``checkpoint_cache.content_key``), or the
error's text) in
the process group's key-value store under a key of this start of the Run;
every other rank reads it there, so each gets the same directory (or the same
error) and rank 0 never waits for them. A rank whose machine does not see
that directory (another node, the cache not on a shared file system) fetches
the same checkpoint into its own node's cache, the ranks of one node taking
turns through the cache's lock: one download per node, none when
``MMT_CACHE_DIR`` is shared.
"""

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from mado_tracking import checkpoint_cache
from mado_tracking.client import ApiClient
from mado_tracking.download import complete_checkpoint
from mado_tracking.errors import ApiError, CheckpointError, MadoError, ResumeError
from mado_tracking.resume import ResumeCheckpoint, resume_checkpoint

logger = logging.getLogger("mado_tracking")

ENV_CHECKPOINT_ID = "MMT_RESUME_CHECKPOINT_ID"
LIST_PAGE_SIZE = 1000
RANK_WAIT_S = 6 * 3600  # other ranks wait this long for rank 0's download (torchrun stops them if rank 0 dies)
_KEY = "mado_tracking/resume_checkpoint/{}/{}"
_ERRORS = {cls.__name__: cls for cls in (CheckpointError, ResumeError, ApiError)}


@dataclass(frozen=True)
class ResumePlan:
    """What a resumed Run's checkpoint list says: ``latest`` (the newest ``complete`` one, a list entry, or
    None) and ``skipped`` (newer ones that are not complete, newest first)."""

    latest: dict | None
    skipped: tuple = field(default=())


def plan_resume(client: ApiClient, run_id: int, *, attempts: int | None = None) -> ResumePlan:
    """Walk ``GET runs/{run_id}/checkpoints/?all=1`` (newest step first) down to the first complete checkpoint.

    ``attempts``: tries of each request (None: retried for ``MMT_RETRY_TIMEOUT``). Raises ``ApiError`` when the
    server refuses or cannot be reached.
    """
    skipped, page = [], 1
    while True:
        answer = client.request(
            "GET",
            f"runs/{run_id}/checkpoints/",
            params={"all": "1", "page_size": LIST_PAGE_SIZE, "page": page},
            attempts=attempts,
        )
        for entry in answer.get("results") or []:
            if entry.get("state") == "complete":
                return ResumePlan(entry, tuple(skipped))
            skipped.append(entry)
        if not answer.get("next"):
            return ResumePlan(None, tuple(skipped))
        page += 1


def on_resumed_start(run) -> None:
    """At the start of a resumed ``Run``: list its checkpoints once, log the INFO line, arm the warning.

    A failed list is a warning only (``resume_checkpoint()`` asks again).
    """
    try:  # a few tries only: this is for a log line; resume_checkpoint() asks again, patiently
        run._resume_plan = plan_resume(run._client, run.id, attempts=3)
    except (MadoError, KeyError, TypeError, ValueError) as error:
        logger.warning("mado: run %s: cannot list its checkpoints (%s)", run.external_id, error)
        return
    latest = run._resume_plan.latest
    if latest is None:
        logger.info("mado: resumed run %s at step %d; it has no complete checkpoint", run.external_id, run.step)
        return
    run._warn_below_step = latest["step"]
    logger.info(
        "mado: resumed run %s at step %d; run %s has checkpoints up to step %d; call run.resume_checkpoint() "
        "to continue from it",
        run.external_id,
        run.step,
        run.external_id,
        latest["step"],
    )


def starting_below(run, step: int, what: str) -> None:
    """Warn, once per Run, that ``what`` (``log_metrics``, ``log_checkpoint``) at ``step`` starts below the
    latest complete checkpoint and ``resume_checkpoint()`` was never called."""
    latest, run._warn_below_step = run._warn_below_step, None
    floor = run._data.get("step_floor") or latest
    logger.warning(
        "mado: run %s was resumed and has a checkpoint at step %d, but this process calls %s at step %d without "
        "having called run.resume_checkpoint(): it is training again what that checkpoint holds. Its points "
        "below step %d are compared with the first ones, not added to the run's curve, and saving a step already "
        "saved fails. Load run.resume_checkpoint() before "
        "training and loop over range(checkpoint.step, total), or start a new run (another id, or resume='never')",
        run.external_id,
        latest,
        what,
        step,
        floor,
    )


def checkpoint_id_from_environment(error_class: type[Exception] = ResumeError) -> int | None:
    """``MMT_RESUME_CHECKPOINT_ID`` as an int >= 1, None when unset; ``error_class`` naming it otherwise
    (``start_run`` asks with ``ValueError`` before any request, ``resume_checkpoint()`` again)."""
    raw = os.environ.get(ENV_CHECKPOINT_ID, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise error_class(f"{ENV_CHECKPOINT_ID} must be a checkpoint id (a whole number >= 1), got {raw!r}")
    return int(raw)


def for_run(run) -> ResumeCheckpoint | None:
    """``Run.resume_checkpoint()`` (a single process, or rank 0): see the module docstring; shares the answer
    with the other ranks under torchrun."""
    shared = run.world_size > 1 and run.resumed
    try:
        found = _find(run)
    except Exception as error:
        if shared:
            _publish(run, {"error": str(error), "kind": type(error).__name__})
        raise
    if shared:
        _publish(run, {"found": None if found is None else _encode(found)})
    return found


def _find(run) -> ResumeCheckpoint | None:
    found = resume_checkpoint()  # a Job's MMT_RESUME_* variables win
    if found is not None:
        return found
    chosen = checkpoint_id_from_environment()
    if not run.resumed:
        if chosen is not None:
            raise ResumeError(
                f"{ENV_CHECKPOINT_ID}={chosen}: only a run resumed under its id (MMT_RESUME=must, allow or auto, "
                f"of a run that exists) fetches a checkpoint; run {run.external_id} was started new"
            )
        return None
    if chosen is not None:
        resource = _chosen_checkpoint(run, chosen)
        return _fetched(run, checkpoint_cache.fetch(run._client, chosen, resource=resource))
    plan = _current_plan(run)
    for entry in plan.skipped:
        logger.warning(
            "mado: run %s: checkpoint %s at step %s %s; %s",
            run.external_id,
            entry.get("id"),
            entry.get("step"),
            _unusable(entry),
            f"resuming from step {plan.latest['step']}" if plan.latest else "no complete checkpoint to resume from",
        )
    if plan.latest is None:
        return None
    return _fetched(run, checkpoint_cache.fetch(run._client, plan.latest["id"]))


def _current_plan(run) -> ResumePlan:
    """The Run's checkpoint list as it stands now: snapshots an earlier process left unuploaded may be the
    newest checkpoints, so they are uploaded first."""
    if run._checkpoints.wait_left_behind() or run._resume_plan is None:
        run._resume_plan = plan_resume(run._client, run.id)
    return run._resume_plan


def _chosen_checkpoint(run, chosen: int) -> dict:
    """The resource of checkpoint ``chosen`` (``MMT_RESUME_CHECKPOINT_ID``) once it may be resumed from: a complete
    checkpoint of this Run and its latest complete one (docs/design/resume.md#resume-anywhere).

    A Run cannot go back: its later steps and checkpoints stay recorded, so every later save would be refused
    as already saved and the points of those steps kept out of its series. Raises ``ApiError`` (unknown id, named),
    ``CheckpointError`` (not complete) or ``ResumeError`` (another Run's, or older than the latest), each
    naming the variable, before any byte is downloaded.
    """
    named = f"{ENV_CHECKPOINT_ID}={chosen}"
    try:
        resource = complete_checkpoint(run._client, chosen)
    except ApiError as error:
        if error.status != 404:
            raise
        message = f"{named}: checkpoint {chosen} not found"
        raise ApiError(message, status=404, code=error.code, detail=error.detail, field=ENV_CHECKPOINT_ID) from None
    except CheckpointError as error:
        raise CheckpointError(f"{named}: {error}", field=ENV_CHECKPOINT_ID) from None
    if resource.get("run_id") != run.id:
        raise ResumeError(
            f"{named}: that checkpoint belongs to another run (id {resource.get('run_id')}), not run {run.external_id}"
        )
    latest = _current_plan(run).latest
    if latest is not None and resource["step"] < latest["step"]:
        recorded = max(run._data.get("last_step") or 0, latest["step"])
        raise ResumeError(
            f"{named} is checkpoint at step {resource['step']}, but run {run.external_id} already recorded steps up "
            f"to {recorded} (its latest checkpoint is at step {latest['step']}): a run cannot go back; to branch "
            f"from an older checkpoint start a new Run from it (mado job resume JOB --checkpoint {chosen}, or "
            "start_run with a new id and load that checkpoint)"
        )
    return resource


def _unusable(entry: dict) -> str:
    state = entry.get("state")
    if state == "pending":
        return "is pending (its upload never completed)"
    if state == "deleted":
        return "was deleted"
    reason = f": {entry['error']}" if entry.get("error") else ""
    return f"was refused ({state}{reason})"


def _fetched(run, found: ResumeCheckpoint) -> ResumeCheckpoint:
    logger.info(
        "mado: run %s resumes from checkpoint %s at step %d (%s)", run.external_id, found.id, found.step, found.path
    )
    _replaying(run, found)
    return found


def _replaying(run, found: ResumeCheckpoint) -> None:
    """Steps from the checkpoint up to the resumed Run's step floor were logged before: the server keeps the first
    points in the Run's series and compares the new ones with them (docs/design/resume.md#same-run-parity); say so
    once, on rank 0."""
    floor = (run._data if run.rank == 0 else run._shared).get("step_floor") or 0
    if found.step < floor and run.rank == 0:
        logger.info(
            "mado: run %s: steps %d to %d were logged before it stopped; the points this process logs for them "
            "are compared with those (the run's curve keeps the first ones)",
            run.external_id,
            found.step,
            floor - 1,
        )


def for_rank(run) -> ResumeCheckpoint | None:
    """``RankRun.resume_checkpoint()`` (rank k > 0): its own ``MMT_RESUME_*`` variables, else rank 0's answer."""
    found = resume_checkpoint()
    if found is not None or not run.resumed:
        if found is None and checkpoint_id_from_environment() is not None:
            raise ResumeError(f"{ENV_CHECKPOINT_ID} is set but run {run.external_id} was started new")
        return found
    shared = _wait(run)
    if "error" in shared:
        error_class = _ERRORS.get(shared.get("kind"), MadoError)
        raise error_class(f"rank {run.rank}: rank 0 could not get the checkpoint to resume from: {shared['error']}")
    value = shared["found"]
    if value is None:
        return None
    path = Path(value["path"])
    if value.get("key") is None:  # rank 0 read a Job's variables: the same directory
        return _decode(value)
    found, _ = checkpoint_cache.check(path.parent, key=value["key"])
    if found is not None:
        _replaying(run, found)
        return found
    logger.info(
        "mado: rank %d: %s is not on this machine; fetching checkpoint %s into this node's cache",
        run.rank,
        path,
        value["id"],
    )
    client = ApiClient(run._config)
    try:
        found = checkpoint_cache.fetch(client, value["id"])
    finally:
        client.close()
    _replaying(run, found)
    return found


def _encode(found: ResumeCheckpoint) -> dict:
    record = None
    try:
        record = json.loads((found.path.parent / checkpoint_cache.RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    return {
        "path": str(found.path),
        "step": found.step,
        "id": found.id,
        "source_run_id": found.source_run_id,
        "info": found.info,
        "key": checkpoint_cache.recorded_key(record) if isinstance(record, dict) else None,
    }


def _decode(value: dict) -> ResumeCheckpoint:
    return ResumeCheckpoint(
        path=Path(value["path"]),
        step=value["step"],
        id=value["id"],
        source_run_id=value["source_run_id"],
        info=value.get("info") or {},
    )


def _store():
    import torch.distributed.distributed_c10d as c10d

    return c10d._get_default_store()


def _publish(run, value: dict) -> None:
    _store().set(_KEY.format(run.id, run.fencing_token), json.dumps(value))


def _wait(run) -> dict:
    store, key = _store(), _KEY.format(run.id, run.fencing_token)
    store.wait([key], timedelta(seconds=RANK_WAIT_S))
    return json.loads(store.get(key))
