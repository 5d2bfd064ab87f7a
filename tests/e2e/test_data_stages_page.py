"""Data stages and "Continue training from these weights" in a real browser (docs/design/runs.md#data-stages;
docs/design/resume.md#continue, #continue-lineage).

carol records a data change on her running Job's Run through the "Training
data history" tab and sees its row; after the Job finished she continues
from its step-20 checkpoint: the dataset versions in force at step 20 are
preselected, she adds one, reviews what will run, launches, lands on the new
Job page, and the new Run's overview shows the chosen versions. The Jobs are
made with the services; Celery is never reached (``send_task`` is recorded).
"""

import re

import pytest
from playwright.sync_api import expect

from checkpoints.models import Checkpoint, CheckpointState
from jobs import services
from jobs.models import Job, JobKind, Queue
from runs.metrics import metrics_ingest
from runs.models import DataStage, Role
from tests.e2e.helpers import log_in, screenshot
from tests.factories import (
    CodeVersionFactory,
    DatasetFactory,
    DatasetVersionFactory,
    MembershipFactory,
    ProjectFactory,
    UserFactory,
)


def _running_job():
    """carol's fine-tuning Job on ``cpu``, running on digits:v1, with synthetic:s1 and noisy:n1 registered."""
    project = ProjectFactory(name="Vision", slug="vision")
    carol = UserFactory(username="carol")
    MembershipFactory(user=carol, project=project, role=Role.MEMBER)
    cpu, _ = Queue.objects.get_or_create(name="cpu", defaults={"description": "CPU workers"})
    code_version = CodeVersionFactory(
        code__project=project,
        code__created_by=carol,
        code__name="digits-mlp",
        version=1,
        entrypoint=["python", "training.py", "--steps", "40"],
    )
    versions = {
        name: DatasetVersionFactory(dataset=DatasetFactory(project=project, name=name), version=version)
        for name, version in (("digits", "v1"), ("synthetic", "s1"), ("noisy", "n1"))
    }
    job = services.job_launch(
        actor=carol,
        code_version=code_version,
        queue=cpu,
        parameters={"lr": 0.05, "steps": 40},
        dataset_version_ids=[versions["digits"].pk],
        name="pretrain",
        kind_of_run="fine_tuning",
    )
    services.job_claim(job_id=job.pk, worker_host="gpu-node-3")
    return job, versions


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_record_a_data_change_then_continue_from_a_checkpoint_with_more_data(browser_page, sent_tasks):
    page = browser_page
    job, versions = _running_job()
    run = job.run
    digits, synthetic, noisy = versions["digits"], versions["synthetic"], versions["noisy"]

    # docs/design/runs.md#data-stages: "Record data change" on the running Run.
    log_in(page, "carol", f"/runs/{run.pk}/")
    page.get_by_role("link", name="Training data history").click()
    expect(page.locator(".initial-composition")).to_contain_text("digits:v1")
    select = page.get_by_label("Dataset versions from this step")
    expect(select).to_have_values([str(digits.pk)])
    page.get_by_label("Start step").fill("15")
    select.select_option([str(digits.pk), str(synthetic.pk)])
    page.get_by_label("Note").fill("add synthetic digits")
    page.get_by_role("button", name="Record data change").click()

    expect(page.locator(".message")).to_contain_text("The data change at step 15 was recorded.")
    row = page.locator('table.data-stages tr[data-step="15"]')
    expect(row.locator("li.added")).to_have_text(re.compile(r"\+\s*synthetic:s1"))
    expect(row.locator("li.removed")).to_have_count(0)
    expect(row.locator("td.note")).to_have_text("add synthetic digits")
    expect(row.locator("td.author")).to_have_text("carol")
    screenshot(page, "data-history")
    stage = DataStage.objects.get(run=run)
    assert stage.start_step == 15 and set(stage.dataset_versions.all()) == {digits, synthetic}
    assert list(run.input_dataset_versions.all()) == [digits]

    # The Job goes on to step 40 with a checkpoint at step 20, then finishes.
    metrics_ingest(
        actor=job.created_by,
        run=run,
        points=[{"key": "train.loss", "value": 2.3 * 0.93**step, "step": step} for step in range(40)],
    )
    Checkpoint.objects.create(
        run=run,
        step=20,
        state=CheckpointState.COMPLETE,
        file_count=3,
        total_bytes=180_000,
        framework="torch",
        created_by=job.created_by,
    )
    services.job_finish(job_id=job.pk, exit_code=0)

    page.get_by_role("link", name="Overview").click()
    marker = page.locator('figure.metric-chart[data-key="train.loss"] li.data-stage-marker[data-step="15"]')
    expect(marker).to_have_count(1)
    expect(marker).to_have_text("Data change at step 15: +synthetic:s1")
    expect(page.locator(".tab-panel")).not_to_contain_text("Record data change")

    # docs/design/resume.md#continue: "Continue training from these weights" on the finished Run's step-20 checkpoint.
    page.get_by_role("link", name="Checkpoints", exact=True).click()
    page.locator('table.checkpoints tr[data-step="20"]').get_by_role(
        "link", name="Continue training from these weights"
    ).click()
    datasets = page.get_by_label("Dataset versions")
    expect(datasets).to_have_values([str(digits.pk), str(synthetic.pk)])  # in force at step 20
    expect(page.get_by_label("Code version")).to_have_value(str(job.code_version_id))
    expect(page.get_by_label("Queue")).to_have_value("cpu")
    datasets.select_option([str(digits.pk), str(synthetic.pk), str(noisy.pk)])
    page.get_by_label("Run name").fill("pretrain + noisy")
    screenshot(page, "continue-form")
    page.get_by_role("button", name="Review").click()

    summary = page.locator("dl.continue-summary")
    expect(summary.locator("dd.step")).to_have_text("20")
    expect(summary.locator("dd.source-run")).to_have_text("pretrain")
    expect(summary.locator("dd.code-version")).to_have_text("digits-mlp v1")
    expect(summary.locator("dd.datasets li")).to_have_text(["digits:v1", "noisy:n1", "synthetic:s1"])
    expect(summary.locator("dd.queue")).to_have_text("cpu")
    screenshot(page, "continue-confirmation")
    page.get_by_role("button", name="Launch Job").click()

    new = Job.objects.get(kind=JobKind.CONTINUE)
    expect(page).to_have_url(re.compile(rf"/jobs/{new.pk}/$"))
    expect(page.locator("h1 .badge.kind")).to_have_text("continued")
    expect(page.locator(".message")).to_contain_text("continues training from the checkpoint at step 20")
    assert [name for name, _args, _kw in sent_tasks] == ["worker.tasks.run_job", "worker.tasks.run_job"]

    page.get_by_role("link", name="pretrain + noisy").first.click()
    expect(page).to_have_url(re.compile(rf"/runs/{new.run_id}/$"))
    expect(page.locator("ul.datasets li")).to_have_text(
        [
            re.compile(r"digits:v1"),
            re.compile(r"noisy:n1"),
            re.compile(r"synthetic:s1"),
        ]
    )
    expect(page.locator("dd.source-checkpoint")).to_contain_text("step 20")
    expect(page.locator("dd.parent")).to_have_text("pretrain")
    screenshot(page, "continued-run")
    assert new.run.kind == "fine_tuning" and new.run.source_checkpoint.run_id == run.pk
