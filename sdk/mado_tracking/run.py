"""``start_run`` and the ``Run`` handle: one Run of training code on the mado server (SPEC F2, F29).

A Run is created on the server when ``start_run`` returns. Leaving a ``with``
block finishes it (``finished``, or ``failed`` on an exception, Ctrl-C
included); without ``with``, call ``run.finish()``. Whatever is still open at
interpreter exit is finished by an ``atexit`` hook: ``failed`` when the
program ended with an uncaught exception, else ``finished``.
"""

import atexit
import json
import logging
import numbers
import secrets
import sys
import threading
import time
from collections.abc import Mapping

from mado_tracking import config as config_module
from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError, MadoError
from mado_tracking.metrics import MetricSender, encode_point

logger = logging.getLogger("mado_tracking")

RUN_KINDS = ("training", "fine_tuning", "evaluation", "other")
FINISH_STATUSES = ("finished", "failed", "aborted")
METRIC_KEY_MAX = 250  # the server's column width (runs.models.MetricPoint.key)
DEFAULT_FLUSH_TIMEOUT_S = 60.0

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_open_runs: set["Run"] = set()
_open_runs_lock = threading.Lock()


def _new_external_id() -> str:
    # Chosen here, not by the server, so a retried create cannot make a second Run (ARCHITECTURE rule 4).
    return "".join(secrets.choice(_ALPHABET) for _ in range(8))


def start_run(project: str | None = None, name: str | None = None, kind: str = "training",
              parameters: Mapping | None = None, *, api_url: str | None = None, api_token: str | None = None,
              flush_timeout: float = DEFAULT_FLUSH_TIMEOUT_S) -> "Run":
    """Create a Run on the mado server and return its handle, status ``running`` (SPEC F2, F29).

    Use it as a context manager (``with start_run(...) as run:``) or call
    ``run.finish()`` yourself.

    Args:
        project: slug of the Project (``MMT_PROJECT`` when None); the token's
            user must be a member or admin of it.
        name: free label shown in the UI (at most 200 characters; None = no name).
        kind: ``"training"``, ``"fine_tuning"``, ``"evaluation"`` or ``"other"``.
        parameters: JSON object of the run's parameters (str keys; values
            str, int, finite float, bool, None, lists and dicts of those);
            recorded once, never overwritten.
        api_url: server root such as ``http://127.0.0.1:8000`` (``MMT_API_URL``).
        api_token: API token (``MMT_API_TOKEN``), sent as ``Authorization: Bearer``.
        flush_timeout: seconds ``finish`` waits for buffered metrics to reach the server.

    Raises:
        ConfigError: API URL, token or project neither passed nor in the environment (named).
        ValueError: unknown ``kind``, or ``parameters`` not a JSON object.
        ApiError: the server refused (unknown project → 404, viewer → 403, bad
            field → 400 naming it) or stayed unreachable through the retries.
    """
    config = config_module.resolve(api_url=api_url, api_token=api_token, project=project)
    if kind not in RUN_KINDS:
        raise ValueError(f"kind must be one of {', '.join(RUN_KINDS)}, got {kind!r}")
    body = {"project": config.project, "kind": kind, "parameters": _check_parameters(parameters),
            "external_id": _new_external_id()}
    if name is not None:
        body["name"] = str(name)
    client = ApiClient(config)
    try:
        data = _create(client, body)
    except BaseException:
        client.close()
        raise
    return Run(client=client, config=config, data=data, flush_timeout=flush_timeout)


def _check_parameters(parameters) -> dict:
    if parameters is None:
        return {}
    if not isinstance(parameters, Mapping):
        raise ValueError(f"parameters must be a dict (a JSON object), got {type(parameters).__name__}")
    parameters = dict(parameters)
    try:
        json.dumps(parameters, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"parameters must be JSON (str keys; finite numbers, str, bool, None, lists, dicts): {exc}"
        ) from None
    return parameters


def _create(client: ApiClient, body: dict) -> dict:
    """POST runs/, retried on transient failures; a retry that finds its own Run already created returns it."""
    retried = False

    def note_retry():
        nonlocal retried
        retried = True

    try:
        return client.request("POST", "runs/", body=body, on_retry=note_retry)
    except ApiError as error:
        if not (retried and error.status == 409 and error.field == "external_id"):
            raise
        found = client.request("GET", "runs/", params={"project": body["project"], "external_id": body["external_id"]})
        for run in found.get("results", []):
            if run.get("external_id") == body["external_id"]:
                return run
        raise


class Run:
    """Handle of a Run on the server; created by ``start_run``.

    Attributes: ``id`` (int, the API id), ``external_id`` (the run id, str),
    ``url`` (absolute URL of the Run page), ``project`` (slug), ``name``,
    ``kind``, ``parameters`` (dict), ``status`` (last status known here).
    """

    def __init__(self, *, client: ApiClient, config: config_module.Config, data: dict, flush_timeout: float):
        self._client = client
        self._config = config
        self._flush_timeout = flush_timeout
        self._update(data)
        self._finishing = False
        self._finish_lock = threading.Lock()
        # An uncaught exception leaves sys.last_value behind; one from before this Run is not ours.
        self._last_value_at_start = getattr(sys, "last_value", None)
        self._sender = MetricSender(config, self.id)
        with _open_runs_lock:
            _open_runs.add(self)

    def _update(self, data: dict) -> None:
        self.id: int = data["id"]
        self.external_id: str = data.get("external_id", "")
        self.url: str = data.get("url", "")
        self.project: str = data.get("project", self._config.project)
        self.name: str = data.get("name", "")
        self.kind: str = data.get("kind", "")
        self.status: str = data.get("status", "")
        self.parameters: dict = data.get("parameters") or {}

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.external_id} {self.name!r} {self.status}>"

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        clean = exc_type is None or (exc_type is SystemExit and exc.code in (0, None))
        try:
            self.finish("finished" if clean else "failed")
        except MadoError as error:
            # Training is over either way; failing the program now would only hide its own outcome.
            logger.error("mado: could not mark run %s as ended: %s", self.id, error)
        return False

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Queue metric values measured at ``step``; sent in the background (SPEC F2).

        Returns at once: no network I/O and no lock held while sending happens
        (a daemon thread posts batches about every second). The values are
        stamped with the current wall-clock time.

        Args:
            metrics: ``{key: value}``; key a non-empty str of at most 250
                characters (``"train.loss"``), value an int or float
                (numpy scalars too; NaN and ±inf are kept and stored).
            step: int >= 0, the number of steps completed or the step index;
                after a resume, keep counting from the checkpoint's step (F2).

        Raises:
            ValueError: a bad step, key or value (the message names the key);
                nothing of the call is queued then.
            TypeError: ``metrics`` is not a mapping.
            MadoError: the Run was already finished.
        """
        if self._finishing:
            raise MadoError(f"run {self.id} is finished; log_metrics must come before finish()")
        if type(step) is not int:
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise ValueError(f"step must be an int >= 0, got {step!r}")
            step = int(step)
        if step < 0:
            raise ValueError(f"step must be an int >= 0, got {step}")
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics must be a dict of {{key: number}}, got {type(metrics).__name__}")
        now = time.time()
        points = []
        for key, value in metrics.items():
            if type(key) is not str or not key or len(key) > METRIC_KEY_MAX:
                raise ValueError(f"metric key must be a non-empty str of at most {METRIC_KEY_MAX} characters, "
                                 f"got {key!r}")
            points.append(encode_point(key, _as_float(key, value), step, now))
        self._sender.add(points)

    def finish(self, status: str = "finished", *, timeout: float | None = None) -> None:
        """Send the buffered metrics, then set the Run's final status on the server (SPEC F29).

        Calling it again does nothing. Metrics still unsent after ``timeout``
        seconds (default: ``flush_timeout`` of ``start_run``) are given up
        with a warning. If the server already holds another final state
        (the Job was aborted meanwhile), that state is kept, with a warning.

        Args:
            status: ``"finished"``, ``"failed"`` or ``"aborted"``.
            timeout: seconds to wait for the metric buffer to drain.

        Raises:
            ValueError: another ``status``.
            ApiError: the status could not be set (server unreachable through
                the retries, or refused).
        """
        if status not in FINISH_STATUSES:
            raise ValueError(f"status must be one of {', '.join(FINISH_STATUSES)}, got {status!r}")
        with self._finish_lock:
            if self._finishing:
                return
            self._finishing = True
        with _open_runs_lock:
            _open_runs.discard(self)
        interrupted = None
        try:
            unsent = self._sender.close(self._flush_timeout if timeout is None else timeout)
        except KeyboardInterrupt as exc:  # a second Ctrl-C: stop waiting for the network
            interrupted, status, unsent = exc, "failed", self._sender.pending
        if unsent:
            logger.warning("mado: %d metric points of run %s could not be sent before finishing", unsent, self.id)
        try:
            self._set_status(status, attempts=1 if interrupted else 5)
        finally:
            self._client.close()
        if interrupted is not None:
            raise interrupted

    def _set_status(self, status: str, *, attempts: int) -> None:
        try:
            data = self._client.request("PATCH", f"runs/{self.id}/", body={"status": status}, attempts=attempts)
        except ApiError as error:
            if error.status != 409:
                raise
            data = self._client.request("GET", f"runs/{self.id}/", attempts=attempts)
            logger.warning("mado: run %s already ended as %s on the server; not marked %s",
                           self.id, data.get("status"), status)
        self._update(data)

    def _finish_at_exit(self) -> None:
        uncaught = getattr(sys, "last_value", None)
        failed = uncaught is not None and uncaught is not self._last_value_at_start
        self.finish("failed" if failed else "finished")


def _as_float(key: str, value) -> float:
    kind = type(value)
    if kind is float:
        return value
    if (kind is int or isinstance(value, numbers.Real)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"metric {key!r}: {value} does not fit a float") from None
    hint = "; pass a Python number such as tensor.item()" if hasattr(value, "item") else ""
    raise ValueError(f"metric {key!r}: value must be an int or float (NaN and ±inf allowed), "
                     f"got {type(value).__name__}{hint}")


@atexit.register
def _finish_open_runs() -> None:
    """Finish every Run left open when the interpreter exits (metrics flushed first)."""
    with _open_runs_lock:
        runs = list(_open_runs)
    for run in runs:
        try:
            run._finish_at_exit()
        except Exception as error:  # noqa: BLE001 - exiting anyway; say why the Run stays open
            logger.error("mado: could not finish run %s at exit: %s", run.id, error)
