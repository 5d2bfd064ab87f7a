"""``start_run``: create a Run on the mado server, or resume one under its id, and return its ``Run`` handle
(docs/design/runs.md#resume-modes, #one-writer-process; docs/design/interfaces.md#surfaces).

Online (the API) or offline (a local directory, ``MMT_MODE=offline``); how the handle finishes the Run is
``mado_tracking.run``'s docstring.
"""

import functools
import logging
import os
from collections.abc import Mapping

from mado_tracking import config as config_module
from mado_tracking import console, distributed
from mado_tracking._base import (
    check_kind,
    check_parameters,
    new_external_id,
)
from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError
from mado_tracking.lease import heartbeat_interval_from_environment
from mado_tracking.resume_fetch import checkpoint_id_from_environment
from mado_tracking.resume_mode import (
    auto_conflict,
    auto_resume_target,
    check_resume_mode,
    check_run_id,
    create_run,
    named_refusal,
    resume_file_path,
    start_body,
    write_resume_file,
)
from mado_tracking.run import DEFAULT_FLUSH_TIMEOUT_S, Run

logger = logging.getLogger("mado_tracking")

ENV_MODE = "MMT_MODE"


def start_run(
    project: str | None = None,
    name: str | None = None,
    kind: str = "training",
    parameters: Mapping | None = None,
    *,
    id: str | None = None,
    resume: str | None = None,
    allow_param_change: bool = False,
    api_url: str | None = None,
    api_token: str | None = None,
    flush_timeout: float = DEFAULT_FLUSH_TIMEOUT_S,
    offline: bool | None = None,
    output: str | os.PathLike | None = None,
):
    """Create or resume a Run on the mado server (or offline, in a local directory); return its handle
    (docs/design/resume.md#steps-continue; docs/design/runs.md#offline, #resume-modes).

    Use it as a context manager (``with start_run(...) as run:``) or call
    ``run.finish()`` yourself.

    Args:
        project: slug of the Project (``MMT_PROJECT`` when None); the token's
            user must be a member or admin of it. Optional offline.
        name: free label shown in the UI (at most 200 characters; None = no name).
        kind: ``"training"``, ``"fine_tuning"``, ``"evaluation"`` or ``"other"``.
        parameters: JSON object of the run's parameters (str keys; values
            str, int, finite float, bool, None, lists and dicts of those).
            On a resume new keys are added; changing a recorded value is
            refused unless ``allow_param_change``.
        id: the run id (``MMT_RUN_ID`` when None): 1 to 128 characters of
            ``[A-Za-z0-9_.-]``, unique in the project; default a fresh random one.
        resume: ``"must"``, ``"allow"``, ``"never"`` or ``"auto"``
            (``MMT_RESUME`` when None; see ``mado_tracking.resume_mode``).
            A resumed run continues its step counter (``run.step``).
        allow_param_change: on a resume, let ``parameters`` change recorded
            values (each change is recorded on the Run).
        api_url: server root such as ``http://127.0.0.1:8000`` (``MMT_API_URL``).
        api_token: API token (``MMT_API_TOKEN``), sent as ``Authorization: Bearer``.
        flush_timeout: seconds ``finish`` waits for buffered metrics to reach the server.
        offline: True = no server: everything goes to a local directory
            (``mado_tracking.offline``; ``mado sync DIR`` uploads it later).
            None = offline when ``MMT_MODE=offline``.
        output: offline only: the run's directory (default ``MMT_OFFLINE_DIR``,
            else ``./mado-offline/<run id>``).

    With ``MMT_RUN_ID`` and no resume mode (a Job's code: the worker
    pre-created that Run ``pending``) the server attaches this process to
    it (docs/jobs.md). Every online start records the run in
    ``<cwd>/.mado/resume.json`` for ``resume="auto"``. Under torchrun every
    rank joins one Run: rank 0 starts it and shares it through the process
    group, initialised before this call (``mado_tracking.distributed``, docs/design/worker.md#distributed).

    Every start prints ``mado: run <id> (started|resumed at step N): <url>`` to stderr (offline: the
    directory; under torchrun rank 0 only), and the first one of a process that set up no logging makes
    the SDK's INFO lines show on stderr; ``MMT_LOG_LEVEL`` sets their level (``mado_tracking.console``).

    Returns:
        ``Run`` online, ``OfflineRun`` offline (same methods).

    Raises:
        ConfigError: online, API URL, token or project neither passed nor in the environment (named).
        ValueError: before any request: unknown ``kind`` or ``resume``, a bad
            ``id``, ``parameters`` not a JSON object, ``MMT_MODE`` not
            online/offline, ``MMT_HEARTBEAT_INTERVAL`` not seconds > 0,
            ``MMT_LOG_LEVEL`` not a level name, online ``MMT_RESUME_CHECKPOINT_ID``
            not a whole number >= 1, or a resume mode offline (the argument and
            variable are named).
        ApiError: the server refused: unknown project → 404 (naming ``MMT_PROJECT``), viewer → 403,
            bad field → 400 naming it, ``must`` with an unknown id → 404 (naming ``MMT_RUN_ID``),
            ``never`` with a taken id → 409, a recorded parameter changed →
            409 ``parameters.<key>``, the run live in another process → 409
            ``run_live``; or it stayed unreachable through the retries.
        MadoError: offline, the directory already holds another run; under
            torchrun, no process group yet, or (ranks > 0) rank 0 could not start the Run.
    """
    check_kind(kind)
    parameters = check_parameters(parameters)
    run_id = check_run_id(id)
    resume = check_resume_mode(resume, run_id)
    log_level = console.log_level_from_environment()
    if offline is None:
        offline = _offline_from_environment()
    if offline:
        if resume is not None:
            raise ValueError(
                f"resume needs the mado server (resume={resume!r}, argument resume= or MMT_RESUME); "
                "offline runs cannot be resumed by id: unset it or run online"
            )
        from mado_tracking.offline import start_offline_run

        console.set_up_logging(log_level)

        return start_offline_run(
            project=project or os.environ.get(config_module.ENV_PROJECT) or None,
            name=name,
            kind=kind,
            parameters=parameters,
            output=output,
            external_id=run_id,
        )
    checkpoint_id_from_environment(ValueError)  # read at run.resume_checkpoint(); refused before any request
    ranks = distributed.ranks_from_environment()
    console.set_up_logging(log_level)
    resolve = functools.partial(config_module.resolve, api_url=api_url, api_token=api_token, project=project)
    start = functools.partial(
        _start_online,
        resolve(),
        kind=kind,
        parameters=parameters,
        name=name,
        run_id=run_id,
        resume=resume,
        allow_param_change=allow_param_change,
        flush_timeout=flush_timeout,
    )
    return start() if ranks is None else distributed.join_run(ranks, start, resolve, flush_timeout)


def _start_online(
    config: config_module.Config, *, kind, parameters, name, run_id, resume, allow_param_change, flush_timeout
) -> "Run":
    heartbeat_interval = heartbeat_interval_from_environment()
    client = ApiClient(config)
    try:
        resume_file = resume_file_path()
        auto_id = None
        if resume == "auto":  # an explicit id makes it "allow"; else the last unfinished run started here
            try:
                auto_id = None if run_id else auto_resume_target(client, config.project, resume_file)
            except ApiError as error:
                raise named_refusal(error, resume) from None
            run_id = run_id or auto_id
            resume = "allow" if run_id is not None else None
        body = start_body(
            project=config.project,
            kind=kind,
            parameters=parameters,
            name=name,
            run_id=run_id or new_external_id(),
            resume=resume,
            allow_param_change=allow_param_change,
        )
        try:
            data = create_run(client, body)
        except ApiError as error:
            error = named_refusal(error, resume)
            raise (error if auto_id is None else auto_conflict(error, run_id=auto_id, path=resume_file)) from None
    except BaseException:
        client.close()
        raise
    write_resume_file(resume_file, project=config.project, run=data)
    return Run(
        client=client,
        config=config,
        data=data,
        flush_timeout=flush_timeout,
        heartbeat_interval=heartbeat_interval,
        resume_file=resume_file,
    )


def _offline_from_environment() -> bool:
    mode = os.environ.get(ENV_MODE, "").strip().lower()
    if mode not in ("", "online", "offline"):
        raise ValueError(f"{ENV_MODE} must be 'online' or 'offline', got {mode!r}")
    return mode == "offline"
