"""``mado login`` makes a token for this machine with the user's password and keeps it where only the user reads
it; commands and the SDK then need no MMT_API_TOKEN; ``mado logout`` revokes it (docs/api.md#tokens)."""

import stat

import pytest
from click.testing import CliRunner

from mado.models import ApiToken
from mado_tracking import credentials
from mado_tracking.cli import main
from mado_tracking.config import resolve, server_identity
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _mado(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_login_keeps_a_machine_token_that_commands_use_and_logout_revokes_it(live_server, member, project, creator):
    RunFactory(project=project, created_by=creator, name="baseline")
    result = _mado("login", "--api-url", live_server.url, "--username", member.username, input="pw-123456\n")
    assert result.exit_code == 0, result.output
    token = ApiToken.objects.get(user=member)
    assert token.name.startswith("mado login on ") and token.scope == "write"
    path = credentials.path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    kept = credentials.lookup(server_identity(live_server.url))
    assert kept["token"] not in (token.prefix, token.digest) and kept["token"].startswith(token.prefix)
    assert resolve(require_project=False).api_token == kept["token"]  # no MMT_API_URL nor MMT_API_TOKEN set
    listed = _mado("runs", "list", "--project", project.slug)
    assert listed.exit_code == 0 and "baseline" in listed.output

    assert _mado("logout").exit_code == 0
    token.refresh_from_db()
    assert token.revoked_at is not None and credentials.lookup(None) is None


def test_a_wrong_password_keeps_nothing(live_server, member):
    result = _mado("login", "--api-url", live_server.url, "--username", member.username, "--password", "wrong")
    assert result.exit_code == 1 and "401" in result.output
    assert not ApiToken.objects.exists() and credentials.lookup(None) is None
