"""PostgreSQL: the points table loses its primary-key index; its history index serves every read (SPEC F2).

Every query names a Run and nearly all a key too, so the ``(run, key, step,
id)`` index answers them; nothing looks a point up by ``id`` alone. The
primary-key index cost a fifth of the database's CPU per stored point (a
second B-tree insert per row of every ``COPY``): measured in one session on
two cores, 20 writers' metrics POST p99 fell from 330–405 ms to 192–246 ms.
``id`` keeps its identity default, so ids stay unique and increasing. Django
still treats ``id`` as the primary key (the model's state is unchanged).
SQLite keeps its rowid key, which costs nothing there.
"""

from django.db import migrations

TABLE = "runs_metricpoint"


def drop_primary_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {TABLE}_pkey")


def add_primary_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id)")


class Migration(migrations.Migration):

    dependencies = [("runs", "0014_logged_model")]

    operations = [migrations.RunPython(drop_primary_key, add_primary_key, elidable=False)]
