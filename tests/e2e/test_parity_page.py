"""A resumed Run's parity verdict in a real browser (docs/design/resume.md#parity, #restore-report).

A Job failed at step 27 after its checkpoint at step 20 and was resumed from it; the resumed Run logs steps 20..39
with the same values as the parent at 20..26, and its SDK reported everything restored. The Run page shows the
"identical" badge and the sentence naming the steps and keys, the Jobs list the badge on the resumed Job, and the
link "Compare with the parent run" opens Compare with both curves and the verdict. The failed Job, the checkpoint
and the points are made with the services; Celery is never reached.
"""

import math
import re

import pytest
from playwright.sync_api import expect

from checkpoints.models import Checkpoint, CheckpointState
from jobs import services
from jobs.models import Queue
from parity.services import restore_report_record
from runs.metrics import metrics_ingest
from runs.models import Role
from tests.e2e.helpers import log_in, screenshot
from tests.factories import CodeVersionFactory, MembershipFactory, ProjectFactory, UserFactory

KEYS = ("train.loss", "train.accuracy")


def value(key: str, step: int) -> float:
    return 2.3 * 0.93**step + math.sin(step) / 97 if key == "train.loss" else 1 - 0.9 * 0.95**step


def log(run, steps) -> None:
    points = [{"key": key, "value": value(key, step), "step": step} for step in steps for key in KEYS]
    metrics_ingest(actor=run.created_by, run=run, points=points)


def _resumed_job():
    """carol's Job that failed at step 27 (checkpoints at 10 and 20) and its resume from step 20, which logged
    steps 20..39."""
    project = ProjectFactory(name="Vision", slug="vision")
    carol = UserFactory(username="carol")
    MembershipFactory(user=carol, project=project, role=Role.MEMBER)
    cpu, _ = Queue.objects.get_or_create(name="cpu", defaults={"description": "CPU workers"})
    code_version = CodeVersionFactory(code__project=project, code__created_by=carol, code__name="digits-mlp", version=1)
    job = services.job_launch(
        actor=carol, code_version=code_version, queue=cpu, parameters={"steps": 40}, dataset_version_ids=[], name="mlp"
    )
    services.job_claim(job_id=job.pk, worker_host="node-3")
    log(job.run, range(27))
    for step in (10, 20):
        Checkpoint.objects.create(
            run=job.run, step=step, state=CheckpointState.COMPLETE, file_count=3, total_bytes=1000, created_by=carol
        )
    failed = services.job_finish(job_id=job.pk, exit_code=1)
    resumed = services.job_resume_from_latest(actor=carol, job=failed)
    services.job_claim(job_id=resumed.pk, worker_host="node-4")
    parts = ["model", "optimizer", "rng.python", "rng.numpy", "rng.torch", "generator.batches", "global_step"]
    restore_report_record(actor=carol, run=resumed.run, body={"parts": dict.fromkeys(parts, "restored")})
    log(resumed.run, range(20, 40))
    return failed, services.job_finish(job_id=resumed.pk, exit_code=0)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_run_page_shows_the_identical_verdict_of_a_resumed_run(browser_page, sent_tasks):
    page = browser_page
    failed, resumed = _resumed_job()

    log_in(page, "carol", f"/runs/{resumed.run_id}/")
    badge = page.locator("h1 .badge.parity")
    expect(badge).to_have_text("identical")
    expect(badge).to_have_attribute("data-verdict", "identical")
    check = page.locator("section.resume-check")
    expect(check.locator(".verdict")).to_have_text(
        "Identical to the parent run, bit for bit, over steps 20–26 on every key both logged "
        "(train.accuracy, train.loss)."
    )
    expect(check.locator(".restored")).to_have_text("Everything the checkpoint holds was restored.")
    expect(page.locator(".not-restored")).to_have_count(0)
    screenshot(page, "run-parity-identical")

    page.goto("/projects/vision/jobs/")
    expect(page.locator(f'tr[data-job="{resumed.pk}"] .badge.parity')).to_have_text("identical")
    expect(page.locator(f'tr[data-job="{failed.pk}"] td.parity')).to_have_text("—")

    page.goto(f"/runs/{resumed.run_id}/")
    page.get_by_role("link", name="Compare with the parent run").click()
    expect(page).to_have_url(re.compile(rf"/compare/\?run={failed.run_id}&run={resumed.run_id}$"))
    expect(page.locator(f'.compare-parity li[data-run="{resumed.run_id}"] .badge.parity')).to_have_text("identical")
    chart = page.locator('figure.metric-chart[data-key="train.loss"]')
    expect(chart.locator(".u-legend .u-series")).to_have_count(3)  # the step, the parent, the resumed Run
    screenshot(page, "compare-parity")
