"""Carry the plain single-per-user tokens of DRF's ``authtoken`` table over as digests (docs/api.md#tokens), then
drop that table: the keys keep working (scope ``admin``: all their user may do, as before; no expiry, named so their users know to rotate them) and
no key stays in clear in the database."""

import hashlib

from django.db import migrations

LEGACY_TABLE = "authtoken_token"


def carry_over(apps, schema_editor):
    connection = schema_editor.connection
    if LEGACY_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("mado", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id, created FROM {LEGACY_TABLE}")
        rows = cursor.fetchall()
    for key, user_id, created in rows:
        token = ApiToken.objects.create(
            user_id=user_id,
            name="token from before named tokens (rotate it)",
            scope="admin",  # what the plain token could do: everything its user may
            prefix=key[:12],
            digest=hashlib.sha256(key.encode()).hexdigest(),
            expires_at=None,
        )
        ApiToken.objects.filter(pk=token.pk).update(created_at=created)
    schema_editor.execute(schema_editor.sql_delete_table % {"table": schema_editor.quote_name(LEGACY_TABLE)})


class Migration(migrations.Migration):
    dependencies = [("mado", "0002_api_tokens")]

    operations = [migrations.RunPython(carry_over, migrations.RunPython.noop)]
