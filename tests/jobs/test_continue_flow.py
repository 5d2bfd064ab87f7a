"""End to end in process (docs/design/runs.md#data-stages, #data-stages-sdk;
docs/design/resume.md#continue, #continue-lineage): a Job's code records a data stage at step 15 through the SDK and
finishes; "continue" from its step-20 checkpoint adds a dataset version; the continue form's preselection is the
composition at step 20; the continued Job runs (the worker task in process, as in tests/worker/test_tasks.py) and
succeeds, starting at step 20 from those weights."""

import io
import json
import sys
import textwrap

import pytest

from checkpoints.models import Checkpoint
from checkpoints.services import code_version_create_with_archive
from jobs.models import JobKind, JobStatus, Queue
from jobs.services import job_launch, run_continue_from_checkpoint
from runs.models import DataStage, Run, RunStatus
from runs.selectors import data_composition_at
from tests.factories import CodeFactory, DatasetFactory, DatasetVersionFactory
from tests.worker.helpers import tar_gz
from worker.tasks import run_job

pytestmark = pytest.mark.django_db(transaction=True)

TRAIN_PY = textwrap.dedent("""
    import json, os, sys, tempfile
    import mado_tracking

    plan = json.load(open(sys.argv[1]))
    with mado_tracking.start_run() as run:
        resumed = run.resume_checkpoint()
        start = resumed.step if resumed else 0
        weights = float(open(os.path.join(resumed.path, "w.txt")).read()) if resumed else 0.0
        print("start", start, "weights", weights, flush=True)
        print("kind", os.environ["MMT_START_KIND"], "ids", os.environ["MMT_DATASET_VERSION_IDS"], flush=True)
        saved = {}
        with tempfile.TemporaryDirectory() as scratch:
            for step in range(start, plan["steps"]):
                weights += 1.0
                run.log_metrics({"train.loss": 1.0 / (step + 1)}, step=step)
                if step == plan["stage_at"]:
                    run.log_training_data_stage(step, plan["ids"], checkpoint_id=saved.get(10),
                                                metadata={"note": "synthetic"})
                if (step + 1) % 10 == 0:
                    open(os.path.join(scratch, "w.txt"), "w").write(repr(weights))
                    saved[step + 1] = run.log_checkpoint(scratch, step=step + 1).id
""")


@pytest.fixture
def worker_settings(settings, tmp_path, live_server):
    settings.MADO_WORKER_WORKDIR = tmp_path / "jobs"
    settings.MADO_JOB_KILL_GRACE = 2
    settings.MADO_PUBLIC_URL = live_server.url + "/"
    settings.MADO_WORKER_GPUS = "none"
    return settings


def test_a_stage_recorded_by_a_job_then_continue_with_an_added_version(
    worker_settings, tmp_path, project, creator, member
):
    digits, synth = DatasetFactory(project=project, name="digits"), DatasetFactory(project=project, name="synth")
    original = DatasetVersionFactory(dataset=digits, version="v1")
    noisy = DatasetVersionFactory(dataset=synth, version="noisy")
    extra = DatasetVersionFactory(dataset=synth, version="rotated")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": 30, "stage_at": 15, "ids": [original.pk, noisy.pk]}))
    code = CodeFactory(project=project, created_by=creator, name="trainer")
    version = code_version_create_with_archive(
        actor=creator,
        code=code,
        entrypoint=[sys.executable, "train.py", str(plan)],
        archive=io.BytesIO(tar_gz([("./", None), ("./train.py", TRAIN_PY.encode())])),
        archive_name="code.tar.gz",
    )
    queue = Queue.objects.get_or_create(name="cpu")[0]
    job = job_launch(actor=creator, code_version=version, queue=queue, parameters={}, dataset_version_ids=[original.pk])

    assert run_job(job.pk) == JobStatus.SUCCEEDED, job.run.log_chunks.values_list("text", flat=True)
    source = Run.objects.get(pk=job.run_id)
    stage = DataStage.objects.get(run=source)
    assert source.status == RunStatus.FINISHED and stage.start_step == 15
    assert set(stage.dataset_versions.all()) == {original, noisy}
    assert stage.checkpoint.step == 10 and stage.metadata == {"note": "synthetic"}
    assert list(source.input_dataset_versions.all()) == [original]  # never overwritten

    step20 = Checkpoint.objects.get(run=source, step=20)
    preselected = data_composition_at(run=source, step=step20.step)
    assert set(preselected) == set(stage.dataset_versions.all())
    chosen = [v.pk for v in preselected] + [extra.pk]
    continued = run_continue_from_checkpoint(
        actor=member,
        checkpoint=step20,
        code_version=version,
        queue=queue,
        dataset_version_ids=chosen,
    )
    assert continued.kind == JobKind.CONTINUE
    assert run_job(continued.pk) == JobStatus.SUCCEEDED
    new_run = Run.objects.get(pk=continued.run_id)
    assert new_run.status == RunStatus.FINISHED and new_run.parent == source and new_run.source_checkpoint == step20
    assert set(new_run.input_dataset_versions.all()) == {original, noisy, extra}
    log = "".join(new_run.log_chunks.order_by("seq").values_list("text", flat=True))
    assert "start 20 weights 20.0" in log
    assert f"kind continue ids {','.join(str(i) for i in sorted(chosen))}" in log
    assert f"kind new ids {original.pk}" in "".join(source.log_chunks.values_list("text", flat=True))
    assert new_run.metric_points.order_by("step").first().step == 20
    change = DataStage.objects.get(run=new_run)  # the added version, recorded at the checkpoint's step
    assert change.start_step == 20 and set(change.dataset_versions.all()) == {original, noisy, extra}
    assert (change.metadata["added"], change.metadata["removed"]) == ([extra.pk], [])
    assert set(data_composition_at(run=new_run, step=19)) == {original, noisy}
    assert set(data_composition_at(run=new_run, step=14)) == {original}  # the source's, before its own stage
    assert set(data_composition_at(run=new_run, step=20)) == {original, noisy, extra}
