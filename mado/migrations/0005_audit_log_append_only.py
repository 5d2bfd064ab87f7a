"""The database itself refuses UPDATE and DELETE on the audit log (docs/api.md#audit), whatever the role: a trigger
on PostgreSQL and SQLite. Deleting old records for retention needs ``manage.py audit_prune``, which opens the door for
its own transaction only (PostgreSQL: ``SET LOCAL mado.audit_prune = 'on'``)."""

from django.db import migrations

TABLE = "mado_auditevent"

POSTGRES_UP = f"""
CREATE OR REPLACE FUNCTION mado_audit_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('mado.audit_prune', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only (%% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER mado_audit_append_only BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION mado_audit_append_only();
"""
POSTGRES_DOWN = f"""
DROP TRIGGER IF EXISTS mado_audit_append_only ON {TABLE};
DROP FUNCTION IF EXISTS mado_audit_append_only();
"""
SQLITE_UP = [
    f"""CREATE TRIGGER mado_audit_no_update BEFORE UPDATE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only (UPDATE refused)'); END;""",
    f"""CREATE TRIGGER mado_audit_no_delete BEFORE DELETE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only (DELETE refused)'); END;""",
]
SQLITE_DOWN = ["DROP TRIGGER IF EXISTS mado_audit_no_update;", "DROP TRIGGER IF EXISTS mado_audit_no_delete;"]


def up(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_UP)
    elif vendor == "sqlite":
        for statement in SQLITE_UP:
            schema_editor.execute(statement)


def down(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_DOWN)
    elif vendor == "sqlite":
        for statement in SQLITE_DOWN:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("mado", "0004_audit_log")]

    operations = [migrations.RunPython(up, down)]
