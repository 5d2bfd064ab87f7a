"""On PostgreSQL a search word of the runs table (``name``, run id or any parameter text contains it, case-insensitive:
docs/workspace.md) is found through trigram indexes instead of reading every Run of the Project: one GIN index per
expression the search compares (``UPPER(column::text) LIKE UPPER('%word%')``, what Django's ``icontains`` writes).
At 100,000 runs the search's query went from about 130 ms to 2 ms (docs/deploy.md#measured).

Built ``CONCURRENTLY`` (the migration is not atomic), so writers of a large runs table are not blocked while it
builds. ``pg_trgm`` ships with PostgreSQL and is a trusted extension (PostgreSQL 13+: the database's owner may
create it); where the role may not, the migration says so and leaves the search without the indexes (slower,
never wrong). SQLite (development only) gets nothing."""

import logging

from django.db import migrations
from django.db.utils import DatabaseError

logger = logging.getLogger(__name__)

INDEXES = {
    "run_search_name_trgm": "upper((name)::text)",
    "run_search_external_id_trgm": "upper((external_id)::text)",
    "run_search_parameters_trgm": "upper((parameters)::text)",
}


def up(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except DatabaseError as exc:
        logger.warning("pg_trgm cannot be created (%s): the runs table's search works without its indexes", exc)
        return
    for name, expression in INDEXES.items():
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON runs_run USING gin ({expression} gin_trgm_ops)"
        )


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in INDEXES:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("runs", "0021_service_accounts")]

    operations = [migrations.RunPython(up, down)]
