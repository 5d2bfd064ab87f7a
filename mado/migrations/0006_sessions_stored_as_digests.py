"""Page sessions are stored under a digest of their key (``mado.sessions``; docs/design/interfaces.md#page-security).
The rows written before hold their key in clear: they are deleted, and their users sign in again. Rewriting them
under their digest would keep them valid, and with them every copy of their keys that a backup already holds."""

from django.db import migrations
from django.db.models.functions import Length

DIGEST_LENGTH = 40  # mado.sessions.STORED_KEY_LENGTH when this was written; Django's own keys are 32 characters


def forget_clear_keys(apps, schema_editor):
    session = apps.get_model("sessions", "Session")
    session.objects.annotate(width=Length("session_key")).exclude(width=DIGEST_LENGTH).delete()


class Migration(migrations.Migration):
    dependencies = [("mado", "0005_audit_log_append_only"), ("sessions", "0001_initial")]

    operations = [migrations.RunPython(forget_clear_keys, migrations.RunPython.noop)]
