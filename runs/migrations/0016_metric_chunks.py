"""Metric points move into chunks, one row of three arrays per key and batch; ``runs_metricpoint`` becomes a view
(docs/design/resume.md#steps-continue).

The points table cost PostgreSQL one heap row and one B-tree entry per
point: with twenty writers, most of the database's CPU and the metrics POST
p99. A chunk (``runs.models.MetricChunk``) holds a batch's points of one key
as ``steps``, ``values`` and ``timestamps`` arrays (PostgreSQL ``bigint[]`` /
``double precision[]`` stored uncompressed, SQLite JSON text), and
``runs_metricpoint`` is now a view that unnests them, so every reader that
filtered points by run and key still does. Forward: every key's points, in
(step, id) order, are cut into chunks of ``CHUNK_POINTS`` (SQLite:
``SQLITE_CHUNK_POINTS``), the table dropped and the view created. Backward:
the table is rebuilt from the view, as migration 0015 left it.
"""

import django.db.models.deletion
from django.db import migrations, models

import runs.models.arrays

CHUNK_POINTS = 10_000  # any size below STRIDE: the largest batch of one key is one chunk (MADO_METRIC_BATCH_MAX)
SQLITE_CHUNK_POINTS = 500  # runs.metrics.SQLITE_CHUNK_POINTS: json_each / json_extract cost grows with its square
STRIDE = 2**20  # runs.models.metrics.CHUNK_ID_STRIDE
POINTS, CHUNKS = "runs_metricpoint", "runs_metricchunk"

# The view both backends read points from: id = chunk id * STRIDE + the point's place in its chunk (from 0).
POSTGRES_VIEW = f"""
CREATE VIEW {POINTS} AS
SELECT c.id * {STRIDE} + p.n - 1 AS id, c.run_id, c.key, p.step, NULLIF(p.value, 'NaN'::float8) AS value,
       p."timestamp", c.id AS chunk_id, c.first_step AS chunk_first_step, c.last_step AS chunk_last_step
FROM {CHUNKS} c CROSS JOIN LATERAL unnest(c.steps, c."values", c.timestamps) WITH ORDINALITY AS p(step, value, "timestamp", n)
"""
SQLITE_VIEW = f"""
CREATE VIEW {POINTS} AS
SELECT c.id * {STRIDE} + s.key AS id, c.run_id, c.key, s.value AS step,
       json_extract(c."values", '$[' || s.key || ']') AS value,
       json_extract(c.timestamps, '$[' || s.key || ']') AS "timestamp",
       c.id AS chunk_id, c.first_step AS chunk_first_step, c.last_step AS chunk_last_step
FROM {CHUNKS} c, json_each(c.steps) AS s
"""


def points_to_chunks(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for column in ("steps", '"values"', "timestamps"):  # already binary: compression only costs CPU
                cursor.execute(f"ALTER TABLE {CHUNKS} ALTER COLUMN {column} SET STORAGE EXTERNAL")
            cursor.execute(f"""
                INSERT INTO {CHUNKS} (run_id, key, first_step, last_step, count, steps, "values", timestamps)
                SELECT run_id, key, min(step), max(step), count(*), array_agg(step ORDER BY step, id),
                       array_agg(coalesce(value, 'NaN'::float8) ORDER BY step, id),
                       array_agg("timestamp" ORDER BY step, id)
                FROM (SELECT *, (row_number() OVER (PARTITION BY run_id, key ORDER BY step, id) - 1) / {CHUNK_POINTS}
                                AS part FROM {POINTS}) AS numbered
                GROUP BY run_id, key, part ORDER BY run_id, key, part
            """)
            cursor.execute(f"DROP TABLE {POINTS}")
            cursor.execute(POSTGRES_VIEW)
            return
        _sqlite_points_to_chunks(apps, cursor)
        cursor.execute(f"DROP TABLE {POINTS}")
        cursor.execute(SQLITE_VIEW)


def _sqlite_points_to_chunks(apps, cursor):
    Chunk = apps.get_model("runs", "MetricChunk")
    cursor.execute(f'SELECT run_id, key, step, value, "timestamp" FROM {POINTS} ORDER BY run_id, key, step, id')
    pending, chunk = [], []

    def close(final=False):
        if chunk:
            steps, values, stamps = zip(*(row[2:] for row in chunk))
            pending.append(
                Chunk(
                    run_id=chunk[0][0],
                    key=chunk[0][1],
                    first_step=steps[0],
                    last_step=steps[-1],
                    count=len(steps),
                    steps=steps,
                    values=values,
                    timestamps=stamps,
                )
            )
            chunk.clear()
        if len(pending) >= 100 or final:
            Chunk.objects.bulk_create(pending)
            pending.clear()

    for rows in iter(lambda: cursor.fetchmany(10_000), []):  # the old table a part at a time, never whole
        for row in rows:
            if chunk and (row[:2] != chunk[0][:2] or len(chunk) == SQLITE_CHUNK_POINTS):
                close()
            chunk.append(row)
    close(final=True)


def chunks_to_points(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE TABLE {POINTS}_saved AS SELECT id, run_id, key, step, value, "timestamp" FROM {POINTS}')
        cursor.execute(f"DROP VIEW {POINTS}")
        schema_editor.create_model(apps.get_model("runs", "MetricPoint"))
        cursor.execute(
            f'INSERT INTO {POINTS} (run_id, key, step, value, "timestamp") '
            f'SELECT run_id, key, step, value, "timestamp" FROM {POINTS}_saved ORDER BY id'
        )
        cursor.execute(f"DROP TABLE {POINTS}_saved")
        if connection.vendor == "postgresql":  # as migration 0015 left the table
            cursor.execute(f"ALTER TABLE {POINTS} DROP CONSTRAINT {POINTS}_pkey")


class Migration(migrations.Migration):
    dependencies = [("runs", "0015_metricpoint_no_primary_key_index")]

    operations = [
        migrations.CreateModel(
            name="MetricChunk",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=250)),
                ("first_step", models.BigIntegerField()),
                ("last_step", models.BigIntegerField()),
                ("count", models.IntegerField()),
                ("steps", runs.models.arrays.NumberArrayField(kind="int8")),
                ("values", runs.models.arrays.NumberArrayField(kind="float8")),
                ("timestamps", runs.models.arrays.NumberArrayField(kind="int8")),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="metric_chunks",
                        to="runs.run",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["run", "key", "last_step", "id"],
                        include=["first_step", "count"],
                        name="metricchunk_run_key_last_idx",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(condition=models.Q(first_step__gte=0), name="metricchunk_step_non_negative"),
                    models.CheckConstraint(
                        condition=models.Q(last_step__gte=models.F("first_step")), name="metricchunk_steps_ordered"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(count__gt=0, count__lt=STRIDE), name="metricchunk_count_range"
                    ),
                ],
            },
        ),
        migrations.RunPython(points_to_chunks, chunks_to_points, elidable=False),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="metricpoint", name="metric_run_key_step_id_idx"),
                migrations.RemoveConstraint(model_name="metricpoint", name="metric_step_non_negative"),
                migrations.AlterModelOptions(name="metricpoint", options={"managed": False}),
                migrations.AlterModelTable(name="metricpoint", table="runs_metricpoint"),
                migrations.AlterField(
                    model_name="metricpoint", name="id", field=models.BigIntegerField(primary_key=True, serialize=False)
                ),
                migrations.AlterField(
                    model_name="metricpoint",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="metric_points",
                        to="runs.run",
                    ),
                ),
                migrations.AddField(
                    model_name="metricpoint",
                    name="chunk",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="points",
                        to="runs.metricchunk",
                    ),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="metricpoint",
                    name="chunk_first_step",
                    field=models.BigIntegerField(),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="metricpoint",
                    name="chunk_last_step",
                    field=models.BigIntegerField(),
                    preserve_default=False,
                ),
            ]
        ),
    ]
