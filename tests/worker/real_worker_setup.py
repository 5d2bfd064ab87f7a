"""Seed a fresh, migrated mado database for ``test_real_worker`` (``python -m tests.worker.real_worker_setup DIR``).

Runs in its own process with the test's ``MADO_DATA_DIR`` (file SQLite, stored files and the filesystem
broker all below it), so a real Celery worker process sees the same rows. For each of ``good`` and
``tampered`` (``model.pt`` changed in storage): a Job that ran and failed (its message stays in the broker,
so the worker also receives a message for a Job that is no longer queued), a checkpoint of its Run at step
20, and the resume of that Run from it, sent to queue ``cpu`` on commit. A third, ``waiting``, is a new Job
whose code waits until stopped. Prints the ids as JSON.
"""

import io
import json
import os
import sys
from pathlib import Path


def main(directory: Path) -> dict:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from checkpoints.services import code_version_create_with_archive
    from jobs.models import Queue
    from jobs.services import job_claim, job_finish, job_launch, run_resume_from_checkpoint
    from runs.models import Code, Membership, Project, Role
    from tests.factories import UserFactory
    from tests.worker.helpers import FILES, code_archive, make_tar, stored_checkpoint

    user = UserFactory(username="carol")
    project = Project.objects.create(name="Vision", slug="vision")
    Membership.objects.create(user=user, project=project, role=Role.MEMBER)
    code = Code.objects.create(project=project, name="trainer", created_by=user)
    queue = Queue.objects.get(name="cpu")
    (directory / "markers").mkdir(exist_ok=True)
    ids = {}
    for label, options in (("good", {}), ("tampered", {"wait": False}), ("waiting", {"wait": True})):
        control = directory / f"control-{label}.json"
        control.write_text(json.dumps({"marker_dir": str(directory / "markers"), **options}))
        version = code_version_create_with_archive(
            actor=user,
            code=code,
            entrypoint=[sys.executable, "train.py", str(control)],
            archive=io.BytesIO(code_archive()),
            archive_name="code.tar.gz",
        )
        job = job_launch(
            actor=user, code_version=version, queue=queue, parameters={}, dataset_version_ids=[], name=label
        )
        if label == "waiting":
            ids[label] = {"job": job.pk, "run_external_id": job.run.external_id}
            continue
        job_claim(job_id=job.pk, worker_host="an-earlier-worker")
        job_finish(job_id=job.pk, exit_code=1)
        stored = make_tar({**FILES, "model.pt": b"X" + FILES["model.pt"][1:]}) if label == "tampered" else None
        checkpoint = stored_checkpoint(job.run, 20, stored=stored)
        resumed = run_resume_from_checkpoint(actor=user, checkpoint=checkpoint)
        ids[label] = {
            "source_job": job.pk,
            "source_run": job.run_id,
            "checkpoint": checkpoint.pk,
            "job": resumed.pk,
            "run_external_id": resumed.run.external_id,
        }
    return ids


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
