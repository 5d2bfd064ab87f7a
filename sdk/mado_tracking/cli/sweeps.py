"""``mado sweep create CONFIG``, ``mado sweep show SWEEP_ID`` and ``mado sweep retry SWEEP_ID TRIAL``
(docs/design/sweeps.md#sweeps, #requeue).

A sweep config is a YAML or JSON file in the W&B style::

    method: grid                      # grid | random | bayes
    metric: {name: val_loss, goal: minimize}
    parameters:
      lr: {values: [0.01, 0.1]}
      hidden: {values: [32, 64]}
    program: python examples/sweep_training.py --steps 60

The server validates it (``POST sweeps/``, a 400 names the refused field);
``mado agent SWEEP_ID`` then runs its trials.
"""

import shlex
from pathlib import Path

import click
import yaml

from mado_tracking.cli._common import api_client, api_options, local_time, project_option, table


def read_config(path: Path) -> dict:
    """The sweep config in the file ``path``: YAML (JSON is YAML too) holding a mapping.

    Raises ``click.BadParameter`` naming the file for unreadable text, a
    syntax error (with its line) or a top level that is not a mapping.
    """
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise click.BadParameter(f"{path}: cannot be read ({error})", param_hint="CONFIG") from None
    except yaml.YAMLError as error:
        raise click.BadParameter(f"{path}: not valid YAML or JSON ({error})", param_hint="CONFIG") from None
    if not isinstance(config, dict):
        raise click.BadParameter(
            f"{path}: must hold a mapping (method, metric, parameters, program), not {type(config).__name__}",
            param_hint="CONFIG",
        )
    return config


def format_parameters(parameters: dict) -> str:
    return " ".join(f"{name}={value}" for name, value in sorted(parameters.items()))


def describe_sweep(sweep: dict) -> str:
    """One line: ``sweep 3 'digits' in project vision: grid search, minimize val_loss, at most 4 trials``."""
    cap = "no trial limit" if sweep.get("run_cap") is None else f"at most {sweep['run_cap']} trials"
    name = f" {sweep['name']!r}" if sweep.get("name") else ""
    return (
        f"sweep {sweep['id']}{name} in project {sweep['project']}: {sweep['method']} search, "
        f"{sweep['metric_goal']} {sweep['metric_name']}, {cap}"
    )


@click.group()
def sweep() -> None:
    """Sweeps: a search over parameters, run trial by trial by `mado agent`."""


@sweep.command("create")
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@project_option(help_text="project slug [env MMT_PROJECT]; default: the config's `project`")
@click.option("--quiet", "-q", is_flag=True, help="print only the new sweep's id")
@api_options
@click.pass_context
def sweep_create(
    ctx: click.Context, config_path: Path, project: str | None, quiet: bool, api_url: str | None, api_token: str | None
) -> None:
    """Create a sweep from CONFIG (YAML or JSON); print its id, its page and the agent command."""
    config = read_config(config_path)
    project = project or config.pop("project", None)  # the server's config has no `project`: it is a field of the sweep
    config.pop("project", None)
    if not project:
        raise click.UsageError("no project: give --project, set MMT_PROJECT or put `project:` in the config")
    with api_client(ctx, api_url, api_token, f"cannot create a sweep from {config_path}") as client:
        created = client.request("POST", "sweeps/", body={"project": project, "config": config}, attempts=1)
    if quiet:
        click.echo(created["id"])
        return
    click.echo(describe_sweep(created))
    click.echo(created.get("url", ""))
    click.echo(f"run its trials with: mado agent {created['id']}")


@sweep.command("show")
@click.argument("sweep_id", metavar="SWEEP_ID", type=click.IntRange(min=1))
@api_options
@click.pass_context
def sweep_show(ctx: click.Context, sweep_id: int, api_url: str | None, api_token: str | None) -> None:
    """Show a sweep: its search, its trials (parameters, metric, state, requeues, run) and the best trial."""
    with api_client(ctx, api_url, api_token, f"cannot read sweep {sweep_id}") as client:
        found = client.request("GET", f"sweeps/{sweep_id}/", attempts=3)
    click.echo(f"{describe_sweep(found)}, created {local_time(found.get('created_at'))}")
    click.echo(f"  program: {shlex.join(found['program'])}")
    if found.get("url"):
        click.echo(f"  {found['url']}")
    metric = found["metric_name"]
    click.echo(
        table(
            ["#", "STATE", "RUN STATUS", "REQUEUES", "RUN", "AGENT", metric.upper(), "PARAMETERS"],
            [
                [
                    str(t["number"]),
                    t["state"],
                    t.get("run_status") or "",
                    str(t.get("requeue_count", 0)),
                    t.get("external_id") or "",
                    t.get("agent") or "",
                    "" if t.get("metric") is None else f"{t['metric']:.6g}",
                    format_parameters(t["parameters"]),
                ]
                for t in found.get("trials", [])
            ],
            empty=f"no trials yet (start them with: mado agent {sweep_id})",
        )
    )
    best = next((t for t in found.get("trials", []) if t["number"] == found.get("best_trial")), None)
    if best is not None:
        click.echo(
            f"best: trial {best['number']} ({metric} {best['metric']:.6g}; {format_parameters(best['parameters'])})"
        )


@sweep.command("retry")
@click.argument("sweep_id", metavar="SWEEP_ID", type=click.IntRange(min=1))
@click.argument("number", metavar="TRIAL", type=click.IntRange(min=1))
@api_options
@click.pass_context
def sweep_retry(ctx: click.Context, sweep_id: int, number: int, api_url: str | None, api_token: str | None) -> None:
    """Retry trial TRIAL of sweep SWEEP_ID after it failed: a fresh run with the same parameters, queued for
    the next `mado agent`; the failed run stays as history.

    \f
    docs/design/sweeps.md#requeue (click shows nothing from the line above on). One attempt: a repeated retry is refused
    (409) with what the trial is now, so a double call never queues two runs.
    """
    with api_client(ctx, api_url, api_token, f"cannot retry trial {number} of sweep {sweep_id}") as client:
        trial = client.request("POST", f"sweeps/{sweep_id}/trials/{number}/retry/", body={}, attempts=1)
    click.echo(
        f"trial {trial['number']} queued again as run {trial['external_id']} "
        f"(retry {trial['retry_count']}); run it with: mado agent {sweep_id}"
    )
