"""``mado checkpoint list RUN``, ``mado checkpoint show ID`` and ``mado checkpoint restore ID --into DIR``
(docs/design/checkpoints.md#a-checkpoint, #metadata; docs/design/worker.md).

``list`` prints a Run's checkpoints with the ids that ``restore``, ``mado job
resume --checkpoint`` and ``mado job continue`` take. ``restore`` is what a
Kubernetes init container runs.

The checkpoint is downloaded, verified and extracted in one streaming pass by
``mado_tracking.extract.restore_checkpoint``, the same strict reader
(``tarverify.CheckpointVerifier``) the Celery worker runs before it starts a
Job's code: every member is checked against the checkpoint's manifest and the
whole tar against its recorded size and SHA-256. ``DIR`` receives the
read-only ``checkpoint/`` directory and ``resume-checkpoint.json``, the layout
the training container sees at ``/mmt/inputs`` (docs/deploy.md). A checkpoint
saved through MLflow (``layout: "files"``, no tar) is fetched file by file, each
checked against its manifest entry (docs/design/checkpoints.md#mlflow-checkpoints). A refused
checkpoint exits with status 1 and ``Checkpoint <id> <what> mismatch: …``,
leaving nothing in ``DIR``.
"""

import json
import os
from pathlib import Path

import click

from mado_tracking.cli._common import api_client, api_options, local_time, pages, table
from mado_tracking.errors import CheckpointError
from mado_tracking.extract import restore_checkpoint
from mado_tracking.extractdir import remove_tree


@click.group("checkpoint")
def checkpoint() -> None:
    """Checkpoints of your Runs."""


@checkpoint.command("list")
@click.argument("run_id", type=click.IntRange(min=1), metavar="RUN")
@api_options
@click.pass_context
def checkpoint_list(ctx: click.Context, run_id: int, api_url: str | None, api_token: str | None) -> None:
    """List the checkpoints of run RUN (its id, as `mado runs list` prints it), highest step first."""
    with api_client(ctx, api_url, api_token, f"cannot list the checkpoints of run {run_id}") as client:
        rows = sorted(pages(client, f"runs/{run_id}/checkpoints/"), key=lambda c: (c["step"], c["id"]), reverse=True)
    click.echo(
        table(
            ["ID", "STEP", "STATE", "FILES", "MB", "FRAMEWORK", "OPTIMIZER", "CREATED"],
            [
                [
                    str(c["id"]),
                    str(c["step"]),
                    c["state"],
                    str(c["file_count"]),
                    f"{c['total_bytes'] / 1e6:,.1f}",
                    c.get("framework") or "",
                    "yes" if c.get("includes_optimizer") else "no",
                    local_time(c.get("created_at")),
                ]
                for c in rows
            ],
            empty=f"run {run_id} has no checkpoints",
        )
    )


@checkpoint.command("show")
@click.argument("checkpoint_id", type=click.IntRange(min=1), metavar="CHECKPOINT_ID")
@api_options
@click.pass_context
def checkpoint_show(ctx: click.Context, checkpoint_id: int, api_url: str | None, api_token: str | None) -> None:
    """Show one checkpoint: its facts, what it holds (training state), whether it was saved on a stop signal."""
    with api_client(ctx, api_url, api_token, f"cannot read checkpoint {checkpoint_id}") as client:
        found = client.request("GET", f"checkpoints/{checkpoint_id}/", attempts=3)
    click.echo(f"checkpoint {found['id']} of run {found['run_id']} at step {found['step']}: {found['state']}")
    facts = [
        ("files", f"{found['file_count']} ({found['total_bytes']:,} bytes)"),
        ("framework", found.get("framework")),
        ("optimizer state", "yes" if found.get("includes_optimizer") else "no"),
        ("stored as", "separate files, saved through MLflow (no tar)" if found.get("layout") == "files" else ""),
        ("tar sha256", found.get("tar_sha256")),
        ("created", local_time(found.get("created_at"))),
        ("completed", local_time(found.get("completed_at")) if found.get("completed_at") else ""),
        ("error", found.get("error")),
    ]
    for label, value in facts:
        if value:
            click.echo(f"  {label}: {value}")
    metadata = found.get("metadata") or {}
    preemption = metadata.get("preemption")
    if isinstance(preemption, dict):
        took = found.get("signal_to_complete_s")
        after = f", complete {took:.1f} s after the signal" if took is not None else ""
        click.echo(f"  saved on signal: {preemption.get('signal')}{after}")
    parts = (metadata.get("training_state") or {}).get("parts")
    click.echo(f"  holds: {', '.join(sorted(parts)) if isinstance(parts, dict) and parts else 'unknown'}")
    other = {key: value for key, value in metadata.items() if key not in ("preemption", "training_state")}
    if other:
        click.echo(f"  metadata: {json.dumps(other, sort_keys=True)}")


@checkpoint.command("restore")
@click.argument("checkpoint_id", type=click.IntRange(min=1), metavar="CHECKPOINT_ID")
@click.option(
    "--into",
    "directory",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="directory to restore into (created if missing; must be empty unless --clean)",
)
@click.option(
    "--clean",
    is_flag=True,
    default=False,
    help="first remove what an earlier restore left in the directory (a restarted init container)",
)
@api_options
@click.pass_context
def checkpoint_restore(
    ctx: click.Context, checkpoint_id: int, directory: Path, clean: bool, api_url: str | None, api_token: str | None
) -> None:
    """Download, verify and extract checkpoint CHECKPOINT_ID into DIR/checkpoint, read-only.

    Refuses (exit status 1, nothing left behind) a checkpoint that is not
    complete or whose stored bytes differ from its manifest, size or SHA-256.
    """
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        _restore_into(ctx, checkpoint_id, directory, clean, api_url, api_token)
    except BaseException:
        if created:  # nothing left behind, not even the directory this command made
            remove_tree(directory)
        raise


def _restore_into(
    ctx: click.Context, checkpoint_id: int, directory: Path, clean: bool, api_url: str | None, api_token: str | None
) -> None:
    if clean:
        for child in directory.iterdir():
            remove_tree(child)
    if any(directory.iterdir()):
        raise click.BadParameter(
            f"{directory} is not empty (use --clean to replace an earlier restore)", param_hint="--into"
        )
    with api_client(ctx, api_url, api_token, f"cannot restore checkpoint {checkpoint_id}") as client:
        try:
            variables = restore_checkpoint(client, checkpoint_id, directory)
        except CheckpointError as error:
            raise click.ClickException(f"{error}; the code must not start from it") from None
    for name, value in sorted(variables.items()):
        click.echo(f"{name}={value}")
    click.echo(f"checkpoint {checkpoint_id} verified and extracted into {os.fspath(directory)}", err=True)
