"""Continue with another data mix, end to end (docs/design/runs.md#data-stages;
docs/design/resume.md#continue, #continue-lineage): ``examples/training.py`` runs as the Job's code (the worker task in
process, as in ``test_continue_flow.py``), trains 20 steps on dataset version A and saves checkpoints 10 and 20; a
continue from step 20 with [A, B] records a data stage at step 20, answers ``at_step`` 19 with [A] and 20 with [A, B],
and the code gets ``MMT_START_KIND=continue`` and the new ids, so it resets its data position and says so in its log."""

import io
import sys

import pytest

from checkpoints.models import Checkpoint
from checkpoints.services import code_version_create_with_archive
from jobs.models import JobStatus, Queue
from jobs.services import job_launch, run_continue_from_checkpoint
from runs.models import DataStage, Run
from tests.deployment import ROOT
from tests.factories import CodeFactory, DatasetFactory, DatasetVersionFactory
from tests.jobs.test_continue_flow import worker_settings  # noqa: F401 (fixture)
from tests.worker.helpers import tar_gz
from worker.tasks import run_job

pytestmark = pytest.mark.django_db(transaction=True)


def _log(run: Run) -> str:
    return "".join(run.log_chunks.order_by("seq").values_list("text", flat=True))


def test_continue_from_step_20_with_an_added_version_records_the_change_and_tells_the_code(
    worker_settings,
    project,
    creator,
    member,
    api,  # noqa: F811
):
    digits = DatasetFactory(project=project, name="digits")
    first, added = (
        DatasetVersionFactory(dataset=digits, version="v3"),
        DatasetVersionFactory(dataset=digits, version="v4"),
    )
    code = CodeFactory(project=project, created_by=creator, name="example")
    archive = tar_gz([("./", None), ("./training.py", (ROOT / "examples" / "training.py").read_bytes())])
    versions = [
        code_version_create_with_archive(
            actor=creator,
            code=code,
            entrypoint=[sys.executable, "training.py", "--steps", steps, "--checkpoint-every", "10"],
            archive=io.BytesIO(archive),
            archive_name="code.tar.gz",
        )
        for steps in ("20", "30")
    ]
    queue = Queue.objects.get_or_create(name="cpu")[0]
    job = job_launch(
        actor=creator, code_version=versions[0], queue=queue, parameters={}, dataset_version_ids=[first.pk]
    )
    assert run_job(job.pk) == JobStatus.SUCCEEDED, _log(job.run)
    source = Run.objects.get(pk=job.run_id)

    continued = run_continue_from_checkpoint(
        actor=member,
        checkpoint=Checkpoint.objects.get(run=source, step=20),
        code_version=versions[1],
        queue=queue,
        dataset_version_ids=[first.pk, added.pk],
    )
    assert run_job(continued.pk) == JobStatus.SUCCEEDED, _log(continued.run)
    new_run = Run.objects.get(pk=continued.run_id)

    stage = DataStage.objects.get(run=new_run)
    assert stage.start_step == 20 and set(stage.dataset_versions.all()) == {first, added}
    assert (stage.metadata["added"], stage.metadata["removed"]) == ([added.pk], [])
    client = api(member)
    url = f"/api/v1/runs/{new_run.pk}/data-stages/"
    at = {
        step: sorted(v["id"] for v in client.get(url, {"at_step": step}).json()["dataset_versions"])
        for step in (19, 20)
    }
    assert at == {19: [first.pk], 20: sorted([first.pk, added.pk])}
    history = client.get(url).json()["results"]
    assert [[v["id"] for v in entry["added"]] for entry in history] == [[added.pk]]

    log = _log(new_run)
    assert f"data mix changed from dataset versions [{first.pk}] to {sorted([first.pk, added.pk])} at step 20" in log
    assert "data position reset" not in _log(source)
    assert new_run.metric_points.order_by("step").first().step == 20
