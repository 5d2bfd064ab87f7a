"""On PostgreSQL the database itself refuses UPDATE and DELETE on the audit log (docs/api.md#audit), whatever the
role: a row trigger. Deleting old records for retention needs ``manage.py audit_prune``, which opens the door for
its own transaction only (``SET LOCAL mado.audit_prune = 'on'``). SQLite (development only) relies on the
application's guard: a trigger there would also refuse the test runner's flush between tests."""

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


def up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_UP)


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_DOWN)


class Migration(migrations.Migration):
    dependencies = [("mado", "0004_audit_log")]

    operations = [migrations.RunPython(up, down)]
