"""Write the facts the runs app now reads onto every existing Run that ran as a Job (docs/design/house.md#arrows)."""

from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.db.models import OuterRef, Subquery

FINAL = ("succeeded", "failed", "aborted")


def write_facts(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    Job = apps.get_model("jobs", "Job")
    Run.objects.filter(pk__in=Job.objects.values("run_id")).update(ran_as_job=True)
    Run.objects.filter(pk__in=Job.objects.filter(status__in=FINAL).values("run_id")).update(job_ended=True)
    running = Job.objects.filter(run_id=OuterRef("pk"), status="running", heartbeat_at__isnull=False)
    for run_id, beat in (
        Run.objects.annotate(beat=Subquery(running.values("heartbeat_at")[:1]))
        .filter(beat__isnull=False)
        .values_list("pk", "beat")
    ):
        alive_until = beat + timedelta(seconds=settings.MADO_JOB_HEARTBEAT_TIMEOUT)
        Run.objects.filter(pk=run_id).update(job_alive_until=alive_until)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_job_nproc_per_node_nnodes"),
        ("runs", "0017_run_job_facts"),
    ]

    operations = [migrations.RunPython(write_facts, migrations.RunPython.noop)]
