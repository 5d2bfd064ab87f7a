"""The Storage page in a real browser: the usage panel, a retention policy previewed, saved and applied, and the
bulk delete of the Runs table (docs/design/checkpoints.md#usage, #retention, #deletion)."""

import io

import pytest
from playwright.sync_api import expect

from checkpoints import services
from checkpoints.models import Checkpoint, CheckpointState
from runs.models import Role
from tests.checkpoints.checkpoint_helpers import declaration, make_tar
from tests.e2e.helpers import log_in, screenshot
from tests.factories import MembershipFactory, ProjectFactory, RunFactory, UserFactory


def _seed():
    """Two Runs: ``resnet`` with checkpoints at steps 100..600 (one resumed from at 200), ``vit`` with 3."""
    project = ProjectFactory(name="Vision", slug="vision")
    admin = UserFactory(username="erin")
    MembershipFactory(user=admin, project=project, role=Role.ADMIN)
    runs = {}
    for name, steps in {"resnet": range(100, 700, 100), "vit": range(10, 40, 10)}.items():
        run = RunFactory(project=project, created_by=admin, name=name)
        for step in steps:
            files = {"model.pt": b"w" * (1000 * step)}
            tar = make_tar(files)
            checkpoint, _ = services.checkpoint_register(actor=admin, run=run, step=step, framework="torch")
            source = io.BytesIO(tar)
            services.checkpoint_upload(actor=admin, checkpoint=checkpoint, source=source, expected_size=len(tar))
            services.checkpoint_complete(actor=admin, checkpoint=checkpoint, **declaration(tar, files))
        runs[name] = run
    source = Checkpoint.objects.get(run=runs["resnet"], step=200)
    RunFactory(project=project, created_by=admin, name="resnet-resumed", source_checkpoint=source)
    return project, runs


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_an_admin_sees_usage_previews_a_policy_and_applies_it(browser_page, settings):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 2
    page = browser_page
    project, runs = _seed()
    log_in(page, "erin", f"/projects/{project.slug}/")
    page.get_by_role("link", name="Storage").click()

    panel = page.locator(".usage-panel")
    expect(panel.locator('tr[data-kind="tar"] td').nth(2)).to_have_text("9")
    expect(panel.locator(".largest-runs tbody tr").first).to_contain_text("resnet")
    expect(panel.locator(".reclaimable")).to_contain_text("reclaimable in 4 checkpoints")
    screenshot(page, "storage-usage-panel")

    page.get_by_label("Keep the last N per run").fill("1")
    page.get_by_role("button", name="Preview").click()
    preview = page.locator("table.preview")
    resnet = preview.locator(f'tr[data-run="{runs["resnet"].pk}"]')
    expect(resnet.locator(".going")).to_have_text("400, 300, 100")
    expect(resnet.locator(".protected")).to_contain_text("source checkpoint of run resnet-resumed")
    expect(preview.locator(f'tr[data-run="{runs["vit"].pk}"] .going')).to_have_text("10")
    screenshot(page, "storage-policy-preview")
    assert Checkpoint.objects.filter(state=CheckpointState.DELETED).count() == 0

    page.get_by_role("button", name="Save policy").click()
    expect(page.locator(".messages, .message").first).to_contain_text("Nothing was deleted")
    page.get_by_role("link", name="Preview the saved policy to apply it").click()
    expect(preview.locator(f'tr[data-run="{runs["resnet"].pk}"] .going')).to_have_text("400, 300, 100")
    page.get_by_role("button", name="Apply this preview").click()
    expect(page.locator(".messages, .message").first).to_contain_text("4 checkpoints deleted")
    deleted = set(Checkpoint.objects.filter(state=CheckpointState.DELETED).values_list("step", flat=True))
    assert deleted == {100, 300, 400, 10}
    expect(panel.locator(".reclaimable")).to_contain_text("reclaimable in 0 checkpoints")
