"""Data migration: the default execution target ``cpu`` (a subprocess runner), so a fresh install can run Jobs."""

from django.db import migrations


def create_cpu_queue(apps, schema_editor):
    Queue = apps.get_model("jobs", "Queue")
    Queue.objects.get_or_create(
        name="cpu",
        defaults={
            "description": "Runs the code as a subprocess on any worker consuming 'cpu'.",
            "runner": "subprocess",
        },
    )


def remove_cpu_queue(apps, schema_editor):
    Queue = apps.get_model("jobs", "Queue")
    Queue.objects.filter(name="cpu", jobs__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]

    operations = [migrations.RunPython(create_cpu_queue, remove_cpu_queue)]
