"""The model registry in a real browser: "Register as model version" on a checkpoint's row, the model's page with
its versions, aliases, source Run and checkpoint, the Project's models list, and the checkpoint that then cannot
be deleted (docs/api.md#model-registry)."""

import pytest
from playwright.sync_api import expect

from mlflow_api.models import RegisteredModel
from mlflow_api.registry import services as registry
from tests.e2e.helpers import log_in, screenshot
from tests.e2e.test_checkpoints_page import _run_with_seven_checkpoints


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_register_a_checkpoint_then_see_it_in_the_registry_and_kept(browser_page, browser):
    page = browser_page
    run = _run_with_seven_checkpoints()  # erin is the Project's admin
    log_in(page, "erin", f"/runs/{run.pk}/checkpoints/?older=1")
    page.locator('tr[data-step="100"]').get_by_role("link", name="Register step 100 as a model version").click()
    expect(page.get_by_role("heading", name="Register the checkpoint at step 100 as a model version")).to_be_visible()
    page.get_by_label("Model name").fill("resnet")
    page.get_by_label("Description").fill("first long run")
    page.get_by_role("button", name="Register as model version").click()

    expect(page.get_by_role("heading", name="resnet")).to_be_visible()
    expect(page.get_by_text("The checkpoint at step 100 is version 1 of model resnet.")).to_be_visible()
    row = page.locator('table.model-versions tr[data-version="1"]')
    expect(row.locator(".source-run")).to_have_text("resnet-long")
    expect(row.get_by_role("link", name="step 100")).to_be_visible()
    model = RegisteredModel.objects.get(name="resnet")
    admin = model.created_by
    registry.checkpoint_register(actor=admin, checkpoint=run.checkpoints.get(step=700), name="resnet")
    registry.model_alias_set(actor=admin, model=model, alias="champion", version=model.versions.get(version=2))
    page.reload()
    expect(page.locator('tr[data-version="2"] .badge.alias')).to_have_text("@champion")
    screenshot(page, "registry-model")

    page.get_by_role("link", name="Models").click()
    section = page.locator('section.registered-model[data-model="resnet"]')
    expect(section.locator(".aliases")).to_contain_text("@champion → 2")
    expect(section.locator("table.model-versions tbody tr")).to_have_count(2)
    screenshot(page, "registry-models")

    page.goto(f"/runs/{run.pk}/checkpoints/?older=1")
    registered = page.locator('tr[data-step="100"]')
    expect(registered.locator(".badge.registered")).to_have_text("registered: resnet v1")
    expect(registered.locator(".reason.deletion")).to_contain_text(
        "is registered as model version resnet v1 and cannot be deleted: delete that model version first."
    )
    expect(registered.get_by_role("link", name="Delete")).to_have_count(0)
    screenshot(page, "registry-checkpoint-kept")

    signed_in = page.context.storage_state()  # the session cookie: the Japanese browser is erin's too
    japanese = browser.new_context(base_url=page.url.split("/runs/")[0], locale="ja-JP", storage_state=signed_in)
    ja = japanese.new_page()
    ja.goto(f"/projects/{run.project.slug}/models/")
    expect(ja.get_by_role("heading", name="登録済みモデル")).to_be_visible()
    screenshot(ja, "registry-models-ja")
    japanese.close()
