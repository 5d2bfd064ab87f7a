"""PostgreSQL: the points table loses its primary-key index; its history index serves every read
(docs/design/resume.md#steps-continue).

Every query names a Run and nearly all a key too, so the ``(run, key, step,
id)`` index answers them; nothing looks a point up by ``id`` alone. The
primary-key index was a second B-tree insert per row of every ``COPY``
(docs/deploy.md, "Measured").
``id`` keeps its identity default, so ids stay unique and increasing. Django
still treats ``id`` as the primary key (the model's state is unchanged).
SQLite keeps its rowid key, which costs nothing there. Waits at most
``LOCK_TIMEOUT`` for the table's lock, then fails, changing nothing.
"""

from django.db import migrations

TABLE = "runs_metricpoint"
LOCK_TIMEOUT = "10s"  # ingest holds the table's lock briefly per batch; a long read must not make it wait forever


def _primary_key(cursor) -> str | None:
    cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'", [TABLE])
    row = cursor.fetchone()
    return row[0] if row else None


def drop_primary_key(apps, schema_editor):
    """Drop the primary key, whatever its name (``runs_metricpoint_part_pkey`` after docs/deploy.md's partitioning)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        name = _primary_key(cursor)
        if name is not None:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute(f'ALTER TABLE {TABLE} DROP CONSTRAINT "{name}"')


def add_primary_key(apps, schema_editor):
    """The key back: ``(id)``, or ``(run_id, id)`` on a table partitioned by run id (it must hold the partition key)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if _primary_key(cursor) is not None:
            return
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", [TABLE])
        columns = "run_id, id" if cursor.fetchone()[0] == "p" else "id"
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY ({columns})")


class Migration(migrations.Migration):
    dependencies = [("runs", "0014_logged_model")]

    operations = [migrations.RunPython(drop_primary_key, add_primary_key, elidable=False)]
