"""``mado sync DIR``: upload an offline run to a server (docs/design/runs.md#offline) without losing or duplicating a
point.

Safe to run twice, or again after a sync that was killed half-way:

- the Run is found by the offline run's ``external_id``
  (``GET runs/?project=&external_id=``) before one is created, and created
  with that ``external_id`` (a lost create answer finds it the same way);
- metric lines are posted in batches cut at fixed line numbers (multiples of
  10,000, counted from the first line of ``metrics.jsonl``), each with the
  ``Idempotency-Key`` ``sync-<external_id>-<first line>-<end line>``: a
  batch the server already stored is a no-op. ``sync-state.json`` in the
  run's directory remembers, per server and Run, how many lines are stored,
  so a later sync starts there (and a run still writing lines can be synced
  again as it grows);
- each checkpoint directory is uploaded with the ``Idempotency-Key``
  ``sync-<external_id>-step-<N>``; steps the Run already holds complete are
  skipped, and a pending one left by a killed sync is replayed and finished;
- the final status is set last (a run still ``running`` offline stays
  ``running``).
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from mado_tracking._base import FINISH_STATUSES
from mado_tracking.checkpoints import upload_checkpoint
from mado_tracking.client import ApiClient
from mado_tracking.config import ENV_PROJECT, Config
from mado_tracking.errors import ConfigError
from mado_tracking.metrics import BATCH_MAX
from mado_tracking.offline import CHECKPOINTS_DIR, METRICS_FILE, read_record, write_json_atomically
from mado_tracking.resume_mode import create_run, find_run
from mado_tracking.status import set_status

logger = logging.getLogger("mado_tracking")

STATE_FILE = "sync-state.json"


@dataclass
class SyncReport:
    """What one ``sync_offline_run`` did: the server Run, lines sent / skipped, checkpoint steps."""

    run: dict
    created: bool = False
    points_sent: int = 0
    points_total: int = 0
    checkpoints_uploaded: list[int] = field(default_factory=list)
    checkpoints_present: list[int] = field(default_factory=list)
    status: str = ""


def sync_offline_run(
    directory, config: Config, *, project: str | None = None, batch_max: int = BATCH_MAX
) -> SyncReport:
    """Upload the offline run in ``directory`` to the server of ``config`` (docs/design/runs.md#offline); see the module
    docstring.

    The project is ``project`` (``--project``), else the one recorded
    offline, else ``config.project`` (``MMT_PROJECT``); one is required.
    ``batch_max``: lines per metrics batch (at most 10,000, the API's limit).

    Raises:
        MadoError: ``directory`` is not an offline run (no readable ``run.json``).
        ConfigError: no project anywhere.
        ApiError: the server refused (a bad point names ``points[i]``;
            nothing of that batch is stored, later lines are not sent) or
            stayed unreachable; sync again once it is fixed.
        CheckpointError: a checkpoint directory was refused.
    """
    directory = Path(directory)
    record = read_record(directory)
    project = project or record.get("project") or config.project
    if not project:
        raise ConfigError(f"{directory}: the offline run has no project; pass --project or set {ENV_PROJECT}")
    client = ApiClient(config)
    try:
        report = _find_or_create(client, project, record)
        report.points_total, report.points_sent = _sync_metrics(
            client, directory, record, report.run, config, batch_max
        )
        _sync_checkpoints(client, directory, record, report)
        report.status = report.run.get("status", "")
        if record.get("status") in FINISH_STATUSES and report.status != record["status"]:
            report.run = set_status(client, report.run["id"], record["status"])
            report.status = report.run.get("status", "")
        return report
    finally:
        client.close()


def _find_or_create(client: ApiClient, project: str, record: dict) -> SyncReport:
    found = find_run(client, project, record["external_id"])
    if found is not None:
        return SyncReport(run=found)
    body = {
        "project": project,
        "name": record.get("name") or "",
        "kind": record.get("kind") or "training",
        "parameters": record.get("parameters") or {},
        "external_id": record["external_id"],
    }
    return SyncReport(run=create_run(client, body), created=True)


def _state_key(config: Config, run: dict) -> str:
    return f"{config.api_url}|{run['project']}|{run['id']}"


def _read_state(directory: Path) -> dict:
    try:
        state = json.loads((directory / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _metric_lines(path: Path):
    """``(line number, text)`` of every complete line; a last line without its newline (a killed writer) is left."""
    if not path.exists():
        return
    with open(path, encoding="ascii") as handle:
        for number, line in enumerate(handle):
            if not line.endswith("\n"):
                logger.warning("mado: %s line %d is incomplete; it is not sent", path, number + 1)
                return
            yield number, line.rstrip("\n")


def _sync_metrics(
    client: ApiClient, directory: Path, record: dict, run: dict, config: Config, batch_max: int
) -> tuple[int, int]:
    """Post the lines not yet stored; return (lines in the file, lines posted as new batches)."""
    state = _read_state(directory)
    key = _state_key(config, run)
    done = int(state.get(key, {}).get("metrics_lines", 0))
    path = f"runs/{run['id']}/metrics/"
    batch, first, total, sent = [], None, 0, 0

    def post(end: int) -> int:
        nonlocal state
        body = ('{"points":[' + ",".join(batch) + "]}").encode("ascii")
        answer = client.request(
            "POST", path, raw=body, headers={"Idempotency-Key": f"sync-{record['external_id']}-{first}-{end}"}
        )
        state = _read_state(directory)
        state[key] = {"run_id": run["id"], "metrics_lines": end}
        write_json_atomically(directory / STATE_FILE, state)
        return (answer or {}).get("stored", 0)

    for number, line in _metric_lines(directory / METRICS_FILE):
        total = number + 1
        if number < done or not line:
            continue
        if first is None:
            first = number
        batch.append(line)
        if (number + 1) % batch_max == 0:  # cut at fixed line numbers so every sync forms the same batches
            sent += post(number + 1)
            batch, first = [], None
    if batch:
        sent += post(total)
    return total, sent


def _sync_checkpoints(client: ApiClient, directory: Path, record: dict, report: SyncReport) -> None:
    run_id = report.run["id"]
    present = set()
    page = client.request("GET", f"runs/{run_id}/checkpoints/", params={"page_size": 1000})
    while True:
        present.update(item["step"] for item in page.get("results", []) if item.get("state") == "complete")
        if not page.get("next"):
            break
        page = client.request("GET", page["next"])
    entries = {entry["step"]: entry for entry in record.get("checkpoints") or []}
    root = directory / CHECKPOINTS_DIR
    steps = (
        sorted(int(p.name[5:]) for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit())
        if root.is_dir()
        else []
    )
    for step in steps:
        if step in present:
            report.checkpoints_present.append(step)
            continue
        entry = entries.get(step, {})
        saved = upload_checkpoint(
            client,
            run_id=run_id,
            directory=root / f"step-{step}",
            step=step,
            idempotency_key=f"sync-{record['external_id']}-step-{step}",
            includes_optimizer=entry.get("includes_optimizer", False),
            framework=entry.get("framework") or None,
            metadata=entry.get("metadata") or None,
        )
        if entry.get("tar_sha256") and saved.sha256 != entry["tar_sha256"]:
            logger.warning(
                "mado: %s changed since it was saved offline (tar SHA-256 %s, recorded %s); uploaded as it is now",
                root / f"step-{step}",
                saved.sha256,
                entry["tar_sha256"],
            )
        report.checkpoints_uploaded.append(step)
