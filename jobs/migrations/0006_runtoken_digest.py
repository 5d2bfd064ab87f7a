"""Run tokens stored as digests (docs/api.md#tokens): each plain key becomes its prefix and SHA-256 digest, then the
plain column is dropped. Tokens active now keep working; their keys cannot be given again (empty salt), so a
retried worker gets a fresh token."""

import hashlib

from django.db import migrations, models


def hash_keys(apps, schema_editor):
    RunToken = apps.get_model("jobs", "RunToken")
    for token in RunToken.objects.all().only("pk", "key").iterator():
        RunToken.objects.filter(pk=token.pk).update(
            prefix=token.key[:12], digest=hashlib.sha256(token.key.encode()).hexdigest()
        )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0005_run_job_facts")]

    operations = [
        migrations.AddField(
            model_name="runtoken", name="salt", field=models.CharField(blank=True, default="", max_length=32)
        ),
        migrations.AddField(
            model_name="runtoken", name="prefix", field=models.CharField(db_index=True, default="", max_length=12)
        ),
        migrations.AddField(model_name="runtoken", name="digest", field=models.CharField(max_length=64, null=True)),
        migrations.RunPython(hash_keys, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="runtoken", name="prefix", field=models.CharField(db_index=True, max_length=12)
        ),
        migrations.AlterField(model_name="runtoken", name="digest", field=models.CharField(max_length=64, unique=True)),
        migrations.RemoveField(model_name="runtoken", name="key"),
    ]
