"""Database helpers shared by the apps (the ground: imports no app)."""

from contextlib import contextmanager

from django.conf import settings
from django.db import connection, transaction


@contextmanager
def read_statement_timeout():
    """A read-only block whose statements PostgreSQL cancels after ``MADO_READ_STATEMENT_TIMEOUT_MS`` milliseconds.

    A cancelled statement raises ``django.db.OperationalError`` (psycopg's
    ``QueryCanceled``). ``SET LOCAL`` lasts until the block's transaction
    ends, so the pooled connection keeps no timeout afterwards. Other
    databases run the block unchanged.
    """
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [str(settings.MADO_READ_STATEMENT_TIMEOUT_MS)]
                )
        yield


@contextmanager
def pipelined():
    """A block whose statements travel together: one round trip to the database instead of one per statement.

    On PostgreSQL, psycopg's pipeline mode sends each statement without
    waiting for its answer, and the block's end waits once for them all. A
    result is read after the block (``fetchone``, ``rowcount``): reading one
    inside waits for everything sent so far. A statement that fails raises
    at the block's end, as ``django.db`` errors do, and the statements sent
    after it are not run; run the block inside ``transaction.atomic`` so that
    none of them is kept then. ``COPY`` cannot run in a pipeline. Elsewhere
    (SQLite) the block runs statement by statement, unchanged.
    """
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield


def id_or_none(value) -> int | None:
    """``value`` (an id from a URL or a form: int or text) as an int, or None when it is not one.

    Selectors filter ``pk=id_or_none(...)``: an id that is not a number finds
    nothing, so it answers 404 like a missing object.
    """
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
