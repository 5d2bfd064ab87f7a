"""The ``mado`` command line (docs/design/runs.md#offline; docs/design/interfaces.md#surfaces).

``mado --version``, ``mado login`` / ``logout`` (a token kept for this machine), ``mado runs list``, ``mado sync DIR``,
``mado code push DIR``, ``mado job launch | list | show | abort | resume | logs``,
``mado sweep create | show | retry``, ``mado alert RUN_ID TITLE`` (docs/design/alerts.md#run-alert)
and ``mado agent SWEEP_ID`` (docs/design/sweeps.md#sweeps, #requeue), ``mado
checkpoint restore ID --into DIR`` (docs/design/worker.md: a Kubernetes init container's restore), ``mado
probe-resume`` (docs/design/checkpoints.md#probe). Configuration as in
the SDK: ``--api-url`` / ``--api-token`` (on ``mado`` or on the command), else ``MMT_API_URL`` / ``MMT_API_TOKEN``;
``--project`` defaults to ``MMT_PROJECT``. Exit statuses: ``mado_tracking.cli._common``.
"""

import click

from mado_tracking._version import __version__
from mado_tracking.cli.agent import agent
from mado_tracking.cli.alerts import alert
from mado_tracking.cli.checkpoints import checkpoint
from mado_tracking.cli.code import code
from mado_tracking.cli.jobs import job
from mado_tracking.cli.login import login, logout
from mado_tracking.cli.probe import probe_resume
from mado_tracking.cli.runs import runs, sync
from mado_tracking.cli.sweeps import sweep


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mado", message="%(prog)s %(version)s")
@click.option("--api-token", default=None, help="API token [env MMT_API_TOKEN]")
@click.option("--api-url", default=None, help="server root, e.g. http://127.0.0.1:8000 [env MMT_API_URL]")
@click.pass_context
def main(ctx: click.Context, api_url: str | None, api_token: str | None) -> None:
    """mado: experiment tracking and training jobs built around the checkpoint."""
    ctx.obj = {"api_url": api_url, "api_token": api_token}


for _command in (login, logout, runs, sync, code, job, sweep, agent, checkpoint, probe_resume, alert):
    main.add_command(_command)

__all__ = ["main"]
