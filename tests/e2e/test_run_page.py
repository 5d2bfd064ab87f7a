"""The Run page in a real browser: log in, see one uPlot chart per metric key, switch to Japanese
(docs/design/resume.md#steps-continue; docs/design/interfaces.md#surfaces)."""

import os
import re
from datetime import timedelta

import pytest
from django.contrib.staticfiles import finders
from django.utils import timezone
from playwright.sync_api import expect

from runs.metrics import metrics_ingest
from runs.models import Role, RunStatus
from tests.e2e.helpers import log_in
from tests.factories import MembershipFactory, ProjectFactory, RunFactory, UserFactory

KEYS = ("train.loss", "val.accuracy", "lr")


def _run_with_metrics(*, status=RunStatus.FINISHED):
    project = ProjectFactory(name="Vision", slug="vision")
    user = UserFactory(username="erin")
    MembershipFactory(user=user, project=project, role=Role.MEMBER)
    started = timezone.now() - timedelta(minutes=42)
    ended = started + timedelta(minutes=41, seconds=13) if status != RunStatus.RUNNING else None
    parent = RunFactory(project=project, created_by=user, name="resnet-first-attempt", status=RunStatus.FAILED)
    run = RunFactory(
        project=project,
        created_by=user,
        name="resnet-resumed",
        parent=parent,
        status=status,
        started_at=started,
        ended_at=ended,
        parameters={"lr": 0.01, "batch_size": 64, "optimizer": "sgd", "layers": [64, 32]},
    )
    points = []
    for step in range(0, 300):
        points.append({"key": "train.loss", "value": 2.3 * 0.99**step + 0.05 * ((step * 7919) % 13) / 13, "step": step})
        points.append({"key": "lr", "value": 0.01 * (0.5 ** (step // 100)), "step": step})
        if step % 10 == 0:
            points.append({"key": "val.accuracy", "value": 1 - 0.9 * 0.985**step, "step": step})
    points.append({"key": "train.loss", "value": "NaN", "step": 300})
    metrics_ingest(actor=user, run=run, points=points)
    return run, user


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_run_page_shows_a_chart_per_key_and_switches_to_japanese(browser_page):
    page = browser_page
    run, _user = _run_with_metrics()
    log_in(page, "erin", f"/runs/{run.pk}/")

    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
    expect(page.get_by_role("heading", name=re.compile("resnet-resumed"))).to_be_visible()
    for key in KEYS:
        chart = page.locator(f'figure.metric-chart[data-key="{key}"] .uplot canvas')
        expect(chart).to_be_visible()
    expect(page.locator('figure.metric-chart[data-key="train.loss"] .skipped')).to_contain_text("1 non-finite value")
    expect(page.get_by_role("link", name="resnet-first-attempt")).to_be_visible()
    if os.environ.get("MADO_E2E_SCREENSHOT"):
        page.screenshot(path=os.environ["MADO_E2E_SCREENSHOT"], full_page=True)

    page.get_by_role("button", name="日本語").click()
    expect(page.locator("html")).to_have_attribute("lang", "ja")
    expect(page.get_by_role("link", name="学習データの履歴")).to_be_visible()
    expect(page.get_by_role("heading", name="メトリクス")).to_be_visible()
    expect(page.locator("figure.metric-chart .uplot")).to_have_count(len(KEYS))
    page.get_by_role("link", name="学習データの履歴").click()
    expect(page.locator(".tab-panel")).to_contain_text("データの変更が記録されていません")

    page.get_by_role("button", name="English").click()
    expect(page.get_by_role("link", name="Training data history")).to_be_visible()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_charts_of_a_running_run_refresh_without_reloading(browser_page):
    if not finders.find("htmx.min.js"):
        pytest.skip("htmx is not installed (npm ci): pages work without live refresh, nothing to test")
    page = browser_page
    run, user = _run_with_metrics(status=RunStatus.RUNNING)
    log_in(page, "erin", f"/runs/{run.pk}/")
    expect(page.locator("figure.metric-chart")).to_have_count(len(KEYS))
    page.evaluate("window.__same_document = true")

    metrics_ingest(actor=user, run=run, points=[{"key": "gpu.memory", "value": 11.5, "step": 300}])
    expect(page.locator('figure.metric-chart[data-key="gpu.memory"] .uplot')).to_be_visible(timeout=12_000)
    assert page.evaluate("window.__same_document") is True
