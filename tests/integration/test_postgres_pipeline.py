"""``mado.db.pipelined`` on PostgreSQL: statements sent together, answers read after, a failure keeps nothing."""

import pytest
from django.db import IntegrityError, connection, transaction

from mado.db import pipelined
from runs.models import MetricBatch


def test_each_statement_answers_after_the_block(postgres, run):
    with transaction.atomic():
        with pipelined():
            first, second = connection.cursor(), connection.cursor()
            first.execute("SELECT %s + 1", [41])
            second.execute(
                f"INSERT INTO {MetricBatch._meta.db_table} (run_id, key, points, created_at) "
                "VALUES (%s, 'k', 1, now())",
                [run.pk],
            )
        assert first.fetchone() == (42,)
        assert second.rowcount == 1
    assert MetricBatch.objects.filter(run=run, key="k").count() == 1


def test_a_failing_statement_raises_at_the_end_of_the_block_and_nothing_of_it_is_kept(postgres, run):
    MetricBatch.objects.create(run=run, key="taken", points=1)
    insert = f"INSERT INTO {MetricBatch._meta.db_table} (run_id, key, points, created_at) VALUES (%s, %s, 1, now())"
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            with pipelined():
                cursor = connection.cursor()
                cursor.execute(insert, [run.pk, "before"])
                cursor.execute(insert, [run.pk, "taken"])  # the unique (run, key) refuses it
                cursor.execute(insert, [run.pk, "after"])
    assert sorted(MetricBatch.objects.filter(run=run).values_list("key", flat=True)) == ["taken"]
