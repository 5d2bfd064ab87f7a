"""SDK test fixtures: no ``MMT_*`` variable leaks in from the developer's shell, each test runs in its own
directory (``start_run`` writes ``.mado/resume.json`` there); a member's token."""

import os

import pytest

from tests.factories import api_key


@pytest.fixture(autouse=True)
def _clean_mmt_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("MMT_"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _own_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    # `mado login`'s kept tokens: the test's own (a developer's ~/.config/mado never answers for a test)
    monkeypatch.setenv("MMT_CONFIG_DIR", str(tmp_path / "mado-config"))


@pytest.fixture
def token_of():
    def make(user) -> str:
        return api_key(user)

    return make


@pytest.fixture
def mmt_env(monkeypatch, live_server, member, project, token_of):
    """``MMT_*`` pointing at the live server as ``member`` of ``project`` (slug ``vision``)."""
    monkeypatch.setenv("MMT_API_URL", live_server.url)
    monkeypatch.setenv("MMT_API_TOKEN", token_of(member))
    monkeypatch.setenv("MMT_PROJECT", project.slug)
    return {"MMT_API_URL": live_server.url, "MMT_API_TOKEN": token_of(member), "MMT_PROJECT": project.slug}


@pytest.fixture
def fresh_restore_check():
    """No restore check pending, and no Run an earlier test left open: a load reports to THE one open Run."""
    from mado_tracking import _base, restore_check

    left_open = set(_base._open_runs)
    _base._open_runs.clear()
    restore_check.reset()
    yield
    restore_check.reset()
    _base._open_runs.update(left_open)  # the interpreter-exit hook still finishes them
