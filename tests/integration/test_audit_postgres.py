"""On PostgreSQL the database refuses UPDATE, DELETE and TRUNCATE of audit records from any role, and lets only
``manage.py audit_prune`` delete old ones (docs/api.md#audit)."""

import io

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from mado.audit import audit_record
from mado.models import AuditEvent
from tests.integration.conftest import postgres  # noqa: F401 - fixture
from tests.mado.test_audit import insert_old_record


@pytest.mark.parametrize("statement", ["UPDATE mado_auditevent SET action = 'x'", "DELETE FROM mado_auditevent"])
def test_the_database_refuses_update_and_delete_of_records(postgres, creator, statement):  # noqa: F811
    audit_record(actor=creator, action="test.thing", object_type="thing")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement)
    assert AuditEvent.objects.get().action == "test.thing"


def test_only_the_prune_command_deletes_and_the_door_closes_behind_it(postgres, creator, settings):  # noqa: F811
    audit_record(actor=creator, action="test.new", object_type="thing")
    insert_old_record()
    settings.MADO_AUDIT_RETENTION_DAYS = 30
    call_command("audit_prune", stdout=io.StringIO())
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["test.new"]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM mado_auditevent")


def test_the_database_refuses_truncate_even_with_the_prune_door_open(postgres, creator):  # noqa: F811
    audit_record(actor=creator, action="test.thing", object_type="thing")
    for door in ("off", "on"):
        with (
            pytest.raises(DatabaseError, match=r"append-only \(TRUNCATE refused\)"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute("SET LOCAL mado.audit_prune = %s", [door])
            cursor.execute("TRUNCATE mado_auditevent")
    assert AuditEvent.objects.get().action == "test.thing"


@pytest.mark.django_db(transaction=True)
def test_the_test_runners_flush_empties_the_log_and_leaves_the_guard_on(postgres, creator):  # noqa: F811
    audit_record(actor=creator, action="test.thing", object_type="thing")
    call_command("flush", interactive=False, verbosity=0)
    assert not AuditEvent.objects.exists()
    with pytest.raises(DatabaseError, match="TRUNCATE refused"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("TRUNCATE mado_auditevent")
