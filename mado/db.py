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
                cursor.execute("SELECT set_config('statement_timeout', %s, true)",
                               [str(settings.MADO_READ_STATEMENT_TIMEOUT_MS)])
        yield
