"""The ``mado`` command line against a live server (docs/design/interfaces.md#surfaces)."""

import pytest
from click.testing import CliRunner

import mado_tracking
from mado_tracking.cli import main
from runs.models import RunStatus
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _mado(*args, env=None):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_version_prints_the_package_version():
    result = _mado("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"mado {mado_tracking.__version__}"


def test_runs_list_prints_a_table_of_visible_runs(mmt_env, project, creator, other_project, outsider):
    RunFactory(project=project, created_by=creator, name="baseline", external_id="base0001")
    RunFactory(
        project=project,
        created_by=creator,
        name="wider",
        external_id="wide0002",
        status=RunStatus.FAILED,
        kind="fine_tuning",
    )
    RunFactory(project=other_project, created_by=outsider, name="secret", external_id="secr0003")
    result = _mado("runs", "list", env={"MMT_PROJECT": None})
    assert result.exit_code == 0, result.output
    header, *rows = result.output.strip().splitlines()
    assert header.split() == ["ID", "RUN", "ID", "NAME", "STATUS", "KIND", "CREATED"]
    assert [row.split()[1:5] for row in rows] == [
        ["wide0002", "wider", "failed", "fine_tuning"],
        ["base0001", "baseline", "running", "training"],
    ]
    assert "secret" not in result.output


def test_runs_list_filters_by_status_kind_and_project(mmt_env, project, creator):
    RunFactory(project=project, created_by=creator, name="baseline")
    RunFactory(project=project, created_by=creator, name="wider", status=RunStatus.FAILED)
    assert "wider" in _mado("runs", "list", "--status", "failed").output
    assert "baseline" not in _mado("runs", "list", "--status", "failed").output
    assert _mado("runs", "list", "--kind", "evaluation").output.strip() == "no runs"
    result = _mado("runs", "list", "--project", "nope")
    assert result.exit_code == 1
    assert "404" in result.output


def test_options_win_over_the_environment(live_server, member, project, creator, token_of):
    RunFactory(project=project, created_by=creator, name="baseline")
    result = _mado("--api-url", live_server.url, "runs", "list", "--api-token", token_of(member))
    assert result.exit_code == 0, result.output
    assert "baseline" in result.output


def test_missing_configuration_names_the_setting():
    result = _mado("runs", "list")
    assert result.exit_code == 1
    assert "MMT_API_URL" in result.output and "--api-url" in result.output
