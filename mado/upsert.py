"""One ``INSERT … ON CONFLICT`` of many rows, the way the metric summaries and rollups are folded in
(docs/design/resume.md#steps-continue; docs/design/interfaces.md#workspace).

On PostgreSQL the rows travel as one array per column, unnested by the
database: a statement of a dozen parameters whatever the row count. As
``VALUES`` with a placeholder per field, psycopg formatted and quoted every
field of a 10,000-point batch's upserts on the client, in the web process,
on every batch (docs/deploy.md, "Measured"). SQLite has no arrays and keeps ``VALUES``, in
statements of at most ``_SQLITE_ROWS`` rows (its parameter limit).
"""

from collections.abc import Sequence

from django.db import connection

_SQLITE_ROWS = 1000


def upsert(*, table: str, fields: Sequence[str], pg_types: Sequence[str], rows: list[tuple], on_conflict: str) -> None:
    """Insert ``rows`` (tuples in ``fields`` order) into ``table``, ``on_conflict`` (``ON CONFLICT (…) DO …``)
    deciding a row whose key is already there; ``pg_types`` are the columns' PostgreSQL types (``bigint``, …).

    No two rows may share the conflict key (PostgreSQL refuses to update one row twice in a statement).
    """
    if not rows:
        return
    names = ", ".join(fields)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            arrays = ", ".join(f"%s::{kind}[]" for kind in pg_types)
            cursor.execute(
                f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}) {on_conflict}",
                [list(column) for column in zip(*rows)],
            )
            return
        for start in range(0, len(rows), _SQLITE_ROWS):
            part = rows[start : start + _SQLITE_ROWS]
            values = ", ".join(["(" + ", ".join(["%s"] * len(fields)) + ")"] * len(part))
            cursor.execute(
                f"INSERT INTO {table} ({names}) VALUES {values} {on_conflict}", [field for row in part for field in row]
            )
