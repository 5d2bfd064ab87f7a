"""Shared fixtures: one Project with a creator, admin, member, viewer, plus an outsider and anonymous.

The ``creator`` is a member who created ``run``; ``outsider`` belongs to
another Project only. ``api(user)`` returns a DRF client authenticated with
that user's API token (None → anonymous).
"""

import os

import pytest
from django.utils import translation
from rest_framework.test import APIClient

from mado_tracking import writeback
from runs.models import Role
from tests.factories import MembershipFactory, ProjectFactory, RunFactory, UserFactory, api_key

DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "live_server"})


def pytest_collection_modifyitems(config, items):
    """``MADO_TEST_DATABASE_ONLY=1`` (``make test-integration``, beside ``make test``): outside ``tests/integration``
    only the tests that touch the database run again, on PostgreSQL; the others gave their verdict in ``make test``
    and would give the same one. So do those marked ``one_database``: what they check does not depend on the
    database (a tar reader's verdict, a training process's), or a test in ``tests/integration`` checks it there."""
    if os.environ.get("MADO_TEST_DATABASE_ONLY") != "1":
        return
    integration = config.rootpath / "tests" / "integration"
    kept, deselected = [], []
    for item in items:
        touches = item.get_closest_marker("django_db") or DATABASE_FIXTURES & set(item.fixturenames)
        again = touches and not item.get_closest_marker("one_database")
        (kept if again or integration in item.path.parents else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def _static_files_found_per_request():
    """WhiteNoise finds a static file when it is asked for, instead of listing every static file each time a test
    client builds its middleware: a listing costs about 45 ms and the suites build thousands of clients. What a
    static file answers is the same (tests/mado/test_page_headers.py asks for one)."""
    from django.conf import settings

    settings.WHITENOISE_AUTOREFRESH = True


@pytest.fixture(scope="session", autouse=True)
def _flush_past_the_audit_truncate_guard():
    """On PostgreSQL the test runner empties every table between transactional tests with one TRUNCATE, which the
    audit log refuses (mado/migrations/0007_audit_log_no_truncate.py). The flush, run as the tables' owner, turns
    that trigger off for its own transaction only: the statements run in one ``atomic`` block, and the trigger is
    on again when it commits."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    real = DatabaseOperations.execute_sql_flush

    def flush(self, sql_list):
        table = self.quote_name("mado_auditevent")
        if any(table in sql for sql in sql_list):
            trigger = f"ALTER TABLE {table} %s TRIGGER mado_audit_no_truncate"
            sql_list = [trigger % "DISABLE", *sql_list, trigger % "ENABLE"]
        real(self, sql_list)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "execute_sql_flush", flush)
        yield


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    """The default PBKDF2 costs about 0.5 s per user and most tests create several."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _default_language():
    """Each test ends in the default language: a page served in Japanese leaves Japanese active in the thread
    (LocaleMiddleware activates a language per request and never deactivates it), which would translate the
    messages a later test reads."""
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def _alert_rules_forgotten():
    """Each test starts with no metric alert rules cached in the process (a new test's Project may reuse an id)."""
    from alerts.evaluate import forget_rules

    forget_rules()


@pytest.fixture
def dropped_windows(monkeypatch):
    """``mado_tracking.writeback`` with 4 KiB windows; the ``(offset, length)`` of each range dropped from the cache."""
    monkeypatch.setattr(writeback, "WINDOW_BYTES", 4096)
    dropped = []
    real = os.posix_fadvise

    def recording(fd, offset, length, advice):
        dropped.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return dropped


@pytest.fixture(autouse=True)
def _artifact_storage(settings, tmp_path):
    """Each test stores artifacts in its own directory (the embedded file-system storage, as configured)."""
    location = {
        "BACKEND": "checkpoints.filesystem.DurableFileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "artifacts")},
    }
    settings.STORAGES = {**settings.STORAGES, "default": location, "artifacts": location}


@pytest.fixture
def project(db):
    return ProjectFactory(name="Vision", slug="vision")


@pytest.fixture
def other_project(db):
    return ProjectFactory(name="Other", slug="other")


def _member(project, username, role):
    user = UserFactory(username=username)
    MembershipFactory(user=user, project=project, role=role)
    return user


@pytest.fixture
def admin(project):
    return _member(project, "alice-admin", Role.ADMIN)


@pytest.fixture
def member(project):
    return _member(project, "mike-member", Role.MEMBER)


@pytest.fixture
def creator(project):
    return _member(project, "carol-creator", Role.MEMBER)


@pytest.fixture
def viewer(project):
    return _member(project, "vera-viewer", Role.VIEWER)


@pytest.fixture
def outsider(other_project):
    return _member(other_project, "oscar-outsider", Role.ADMIN)


@pytest.fixture
def run(project, creator):
    return RunFactory(project=project, created_by=creator, name="baseline")


@pytest.fixture
def api():
    def make(user=None):
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key(user)}")
        return client

    return make


@pytest.fixture
def client_as(request, api):
    """``client_as(role)``: an API client for a role fixture name, or ``"anonymous"``."""

    def make(role):
        return api(None if role == "anonymous" else request.getfixturevalue(role))

    return make


@pytest.fixture
def login(client):
    """``login(user)``: Django's test client, logged in as ``user`` (pages)."""

    def as_user(user):
        client.force_login(user)
        return client

    return as_user


@pytest.fixture
def ended():
    """``[(run id, status)]`` of every Run whose end was told to ``runs.hooks.run_ended`` receivers, in order.

    Every caller goes through ``runs.liveness.run_ended_effects``: status changes, the reaper and a Job's end.
    """
    from runs import hooks

    calls = []

    def record(sender, *, run, **kwargs):
        calls.append((run.pk, run.status))

    hooks.run_ended.connect(record, dispatch_uid="tests.ended")
    yield calls
    hooks.run_ended.disconnect(dispatch_uid="tests.ended")


@pytest.fixture
def corrupt_events():
    """``[(checkpoint id, reason)]`` of every ``runs.hooks.checkpoint_corrupt`` sent, in order."""
    from runs import hooks

    calls = []

    def record(sender, *, checkpoint, reason, **kwargs):
        calls.append((checkpoint.pk, reason))

    hooks.checkpoint_corrupt.connect(record, dispatch_uid="tests.corrupt_events")
    yield calls
    hooks.checkpoint_corrupt.disconnect(dispatch_uid="tests.corrupt_events")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    """On SQLite, the test database is a file rather than pytest-django's shared in-memory one.

    Django hands the live server's threads the test's own connection to an
    in-memory database; a sqlite3 connection used by two threads at once can
    raise "table is locked" or hang both. With a file each thread has its own
    connection, as with PostgreSQL, and WAL with a busy timeout (settings)
    makes lock waits waits. Under pytest-xdist each worker has a database of its own: the file lies in
    the worker's own temporary folder, and PostgreSQL's name gets the worker's suffix (``test_postgres_gw1``).
    """
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3":
        database.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("database") / "test.sqlite3")
