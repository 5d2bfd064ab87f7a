"""The Checkpoint tab in a real browser: the newest 5 of 7, the toggle, an admin deletes an old one (F4, F5, F29)."""

import io
import os
import re

import pytest
from playwright.sync_api import expect

from checkpoints import services
from checkpoints.models import Checkpoint, CheckpointState
from runs.models import Role
from tests.checkpoints.checkpoint_helpers import declaration, make_tar
from tests.factories import MembershipFactory, ProjectFactory, RunFactory, UserFactory
from tests.e2e.helpers import log_in, screenshot


def _run_with_seven_checkpoints():
    project = ProjectFactory(name="Vision", slug="vision")
    admin = UserFactory(username="erin")
    MembershipFactory(user=admin, project=project, role=Role.ADMIN)
    run = RunFactory(project=project, created_by=admin, name="resnet-long")
    for step in range(100, 800, 100):
        files = {"model.pt": os.urandom(2048 * step), "optimizer.pt": os.urandom(512 * step)}
        tar = make_tar(files)
        checkpoint, _ = services.checkpoint_register(
            actor=admin, run=run, step=step, framework="torch", includes_optimizer=True
        )
        services.checkpoint_upload(actor=admin, checkpoint=checkpoint, source=io.BytesIO(tar), expected_size=len(tar))
        services.checkpoint_complete(actor=admin, checkpoint=checkpoint, **declaration(tar, files))
    return run


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_checkpoint_tab_shows_five_toggles_to_seven_and_an_admin_deletes_an_old_one(browser_page):
    page = browser_page
    run = _run_with_seven_checkpoints()
    log_in(page, "erin", f"/runs/{run.pk}/checkpoints/")
    rows = page.locator("table.checkpoints tbody tr")

    expect(page.get_by_role("link", name="Checkpoints", exact=True)).to_have_attribute("aria-current", "page")
    expect(rows).to_have_count(5)
    expect(rows.first).to_have_attribute("data-step", "700")
    expect(rows.first.locator("a.download")).to_have_attribute("href", re.compile(r"/api/v1/checkpoints/\d+/tar$"))
    expect(rows.first).to_contain_text("one of the newest 5 complete checkpoints")
    screenshot(page, "checkpoint-tab")

    page.get_by_role("link", name="Show older checkpoints beyond the keep count (2)").click()
    expect(rows).to_have_count(7)
    expect(page.get_by_role("link", name="Hide older checkpoints")).to_be_visible()
    oldest = page.locator('tr[data-step="100"]')
    oldest.get_by_role("link", name="Delete").click()

    expect(page.get_by_role("heading", name="Delete the checkpoint at step 100?")).to_be_visible()
    page.get_by_role("button", name="Delete checkpoint").click()

    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/checkpoints/\?older=1$"))
    expect(page.locator(".message")).to_have_text("The checkpoint at step 100 was deleted.")
    expect(rows).to_have_count(7)
    expect(oldest).to_have_attribute("data-state", "deleted")
    expect(oldest.locator(".badge")).to_have_text("deleted")
    expect(oldest.locator("a.download")).to_have_count(0)
    expect(oldest.get_by_role("link", name="Delete")).to_have_count(0)
    assert Checkpoint.objects.get(run=run, step=100).state == CheckpointState.DELETED
    screenshot(page, "checkpoint-tab-older")

    page.get_by_role("link", name="Hide older checkpoints").click()
    expect(rows).to_have_count(5)
    expect(page.get_by_role("link", name="Show older checkpoints beyond the keep count (1)")).to_be_visible()

    page.get_by_role("button", name="日本語").click()
    expect(page.get_by_role("link", name="保持数を超える古いcheckpointを表示 (1)")).to_be_visible()
    expect(rows.first).to_contain_text("最新の 5 件")
    screenshot(page, "checkpoint-tab-ja")
    page.get_by_role("link", name="step 700 のcheckpoint").click()
    expect(page.get_by_role("heading", name=re.compile("step 700 のcheckpoint"))).to_be_visible()
    expect(page.locator("table.manifest tbody tr")).to_have_count(2)
    screenshot(page, "checkpoint-detail-ja")
