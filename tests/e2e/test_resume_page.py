"""Resuming a failed Job from a chosen checkpoint in a real browser
(docs/design/resume.md#who-may-resume, #from-a-checkpoint).

The creator opens the failed Job's Run → Checkpoint tab → "Resume from this
checkpoint" → the confirmation → "Resume in a new Run", and lands on the new
Job marked "resumed"; a member who did not create the Run sees the reason
instead of the button. The failed Job, its Run and checkpoints are made with
the services; Celery is never reached (``send_task`` is recorded).
"""

import re

import pytest
from playwright.sync_api import expect

from checkpoints.models import Checkpoint, CheckpointState
from jobs import services
from jobs.models import Job, JobKind, Queue
from runs.metrics import metrics_ingest
from runs.models import Role
from tests.e2e.helpers import log_in, screenshot
from tests.factories import CodeVersionFactory, MembershipFactory, ProjectFactory, UserFactory


def _failed_job():
    """carol's training Job on ``cpu`` that failed at step 27 after saving checkpoints at steps 10 and 20."""
    project = ProjectFactory(name="Vision", slug="vision")
    carol = UserFactory(username="carol")
    MembershipFactory(user=carol, project=project, role=Role.MEMBER)
    MembershipFactory(user=UserFactory(username="mike"), project=project, role=Role.MEMBER)
    cpu, _ = Queue.objects.get_or_create(name="cpu", defaults={"description": "CPU workers"})
    Queue.objects.get_or_create(name="gpu-a100", defaults={"description": "A100 pool"})
    code_version = CodeVersionFactory(
        code__project=project,
        code__created_by=carol,
        code__name="digits-mlp",
        version=1,
        entrypoint=["python", "training.py", "--steps", "40", "--checkpoint-every", "10", "--fail-at-step", "27"],
    )
    job = services.job_launch(
        actor=carol,
        code_version=code_version,
        queue=cpu,
        parameters={"lr": 0.05, "steps": 40},
        dataset_version_ids=[],
        name="digits-mlp",
    )
    services.job_claim(job_id=job.pk, worker_host="gpu-node-3")
    metrics_ingest(
        actor=carol,
        run=job.run,
        points=[{"key": "train.loss", "value": 2.3 * 0.93**step, "step": step} for step in range(27)],
    )
    for step in (10, 20):
        Checkpoint.objects.create(
            run=job.run,
            step=step,
            state=CheckpointState.COMPLETE,
            file_count=3,
            total_bytes=180_000 + step,
            framework="torch",
            includes_optimizer=True,
            created_by=carol,
        )
    services.job_append_log(job_id=job.pk, text="step 26 loss 0.35\nSimulatedFailure: --fail-at-step 27\n")
    return services.job_finish(job_id=job.pk, exit_code=1)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_creator_resumes_from_a_checkpoint_and_another_member_sees_why_not(browser_page, sent_tasks):
    page = browser_page
    failed = _failed_job()
    run = failed.run

    log_in(page, "carol", "/projects/vision/jobs/")
    row = page.locator(f'tr[data-job="{failed.pk}"]')
    expect(row.locator(".badge.status")).to_have_text("failed")
    expect(row.get_by_role("link", name="Resume from latest checkpoint")).to_be_visible()
    row.get_by_role("link", name="digits-mlp").click()

    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
    page.get_by_role("link", name="Checkpoints", exact=True).click()
    checkpoint_row = page.locator('table.checkpoints tr[data-step="20"]')
    checkpoint_row.get_by_role("link", name="Resume from this checkpoint").click()

    expect(page.locator(".resume-sentence")).to_have_text(
        "Training will resume as a new Run from the checkpoint at step 20."
    )
    expect(page.get_by_label("Code version")).to_have_value(str(failed.code_version_id))
    expect(page.get_by_label("Queue")).to_have_value("cpu")
    screenshot(page, "resume-confirmation")
    page.get_by_role("button", name="Resume in a new Run").click()

    new = Job.objects.get(kind=JobKind.RESUME)
    expect(page).to_have_url(re.compile(rf"/jobs/{new.pk}/$"))
    expect(page.locator("h1 .badge.kind")).to_have_text("resumed")
    expect(page.locator(".message")).to_contain_text("from the checkpoint at step 20")
    expect(page.locator("dd.source-checkpoint")).to_have_text("step 20")
    assert new.run.parent_id == run.pk and new.run.source_checkpoint.step == 20
    assert [name for name, _args, _kw in sent_tasks] == ["worker.tasks.run_job", "worker.tasks.run_job"]

    page.get_by_role("link", name="Jobs").click()
    new_row = page.locator(f'tr[data-job="{new.pk}"]')
    expect(new_row.locator(".badge.kind")).to_have_text("resumed")
    expect(new_row.locator(".badge.status")).to_have_text("queued")
    old_row = page.locator(f'tr[data-job="{failed.pk}"]')
    expect(old_row.locator(".badge.kind")).to_have_text("new")
    expect(old_row.locator(".resume-active")).to_contain_text("A resume of this run is already queued or running")
    expect(old_row.get_by_role("link", name=f"Job {new.pk}")).to_be_visible()
    expect(page.locator("#job-table")).to_have_attribute("data-live", "true")

    screenshot(page, "jobs-list")

    page.get_by_role("link", name=f"Job {failed.pk}", exact=True).first.click()
    expect(page.locator(".job-error")).to_contain_text("The code exited with code 1.")
    expect(page.locator("pre.log")).to_contain_text("SimulatedFailure: --fail-at-step 27")
    screenshot(page, "job-failed")

    # docs/design/resume.md#steps-continue: the resumed Run's curve joins its parent's (steps 0..19 from the parent,
    # 20.. from the new Run).
    metrics_ingest(
        actor=new.created_by,
        run=new.run,
        points=[{"key": "train.loss", "value": 2.3 * 0.93**step, "step": step} for step in range(20, 40)],
    )
    page.goto(f"/runs/{new.run_id}/")
    page.get_by_role("switch", name="Show with ancestors").click()
    chart = page.locator('figure.metric-chart[data-key="train.loss"]')
    expect(chart.locator(".u-legend .u-series")).to_have_count(3)  # the step, the parent, the resumed Run
    expect(chart.locator(".u-legend")).to_contain_text(run.name or run.external_id)
    expect(chart.locator('li.resume-marker[data-step="20"]')).to_have_count(1)
    screenshot(page, "run-with-ancestors")

    page.get_by_role("button", name="Log out").click()
    log_in(page, "mike", f"/runs/{run.pk}/checkpoints/")
    expect(page.locator(".resume-note .resume-refusal")).to_have_text(
        "This is not your run: only its creator and project admins can stop, rerun or resume its Job."
    )
    expect(page.get_by_role("link", name="Resume from this checkpoint")).to_have_count(0)
    screenshot(page, "checkpoint-tab-not-creator")
    assert Job.objects.count() == 2
