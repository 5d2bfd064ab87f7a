"""Apply is the preview: a retention preview is a plan with an id, and applying it deletes exactly the previewed
checkpoints, minus those protected since (each named with its reason), or nothing with a fresh preview when the
policy would now delete more (docs/design/checkpoints.md#retention)."""

import pytest

from checkpoints.models import Checkpoint, CheckpointDeletion, CheckpointState
from runs.models import Role
from tests.checkpoints.checkpoint_helpers import save
from tests.checkpoints.test_retention import seeded  # noqa: F401 (fixture)
from tests.factories import MembershipFactory, ProjectFactory, RunFactory

pytestmark = pytest.mark.django_db


def deleted_steps() -> set[int]:
    return set(Checkpoint.objects.filter(state=CheckpointState.DELETED).values_list("step", flat=True))


@pytest.fixture
def urls(project):
    base = f"/api/v1/projects/{project.slug}/retention-policy/"
    return {"policy": base, "preview": f"{base}preview/", "apply": f"{base}apply/"}


@pytest.fixture
def planned(api, admin, urls, seeded):  # noqa: F811
    """The saved policy "keep the last 1" previewed: steps 4, 3, 1 go; 2 (a resume source) and 5, 6 (the keep
    count of 2) are protected."""
    client = api(admin)
    assert client.put(urls["policy"], {"keep_last": 1}, format="json").status_code == 200
    preview = client.post(urls["preview"], {}, format="json").json()
    assert sorted(c["step"] for r in preview["runs"] for c in r["going"]) == [1, 3, 4]
    assert preview["plan"]
    return preview


def apply(client, urls, plan: str):
    return client.post(urls["apply"], {"plan": plan}, format="json")


def going_steps(preview: dict) -> list[int]:
    return sorted(c["step"] for r in preview["runs"] for c in r["going"])


def test_a_checkpoint_arriving_after_the_preview_deletes_nothing_and_answers_the_fresh_plan(
    api,
    admin,
    creator,
    run,
    urls,
    planned,
    seeded,  # noqa: F811
):
    save(api(creator), run, 7)  # step 5 leaves the keep count: the policy would now delete it too
    answer = apply(api(admin), urls, planned["plan"])
    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert (body["error"], body["field"]) == ("plan_changed", "plan")
    assert body["detail"] == "the plan changed: review it again"
    assert going_steps(body["plan"]) == [1, 3, 4, 5]
    assert deleted_steps() == set(), "nothing deleted"
    again = apply(api(admin), urls, body["plan"]["plan"])
    assert again.status_code == 200 and sorted(c["step"] for c in again.json()["deleted"]) == [1, 3, 4, 5]


def test_a_policy_edit_that_adds_a_deletion_deletes_nothing(api, admin, urls, seeded):  # noqa: F811
    client = api(admin)
    assert client.put(urls["policy"], {"keep_last": 3}, format="json").status_code == 200
    preview = client.post(urls["preview"], {}, format="json").json()
    assert going_steps(preview) == [1, 3]
    assert client.put(urls["policy"], {"keep_last": 1}, format="json").status_code == 200  # another admin's edit
    answer = apply(client, urls, preview["plan"])
    assert answer.status_code == 409 and going_steps(answer.json()["plan"]) == [1, 3, 4]
    assert deleted_steps() == set()


def test_a_policy_edit_that_keeps_more_deletes_only_what_both_delete(api, admin, urls, planned):
    client = api(admin)
    assert client.put(urls["policy"], {"keep_last": 4}, format="json").status_code == 200  # keeps 6, 5, 4, 3
    answer = apply(client, urls, planned["plan"])
    assert answer.status_code == 200, answer.content
    assert [c["step"] for c in answer.json()["deleted"]] == [1]
    reasons = {c["step"]: c["reason"] for c in answer.json()["refused"]}
    assert reasons.keys() == {3, 4}
    assert all("kept by the saved retention policy now" in reason for reason in reasons.values())
    assert deleted_steps() == {1}


def test_a_lower_keep_count_deletes_nothing_and_a_higher_one_skips_with_the_reason(api, admin, urls, planned, settings):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1  # step 5 no longer protected: the policy would delete it too
    answer = apply(api(admin), urls, planned["plan"])
    assert answer.status_code == 409 and going_steps(answer.json()["plan"]) == [1, 3, 4, 5]
    assert deleted_steps() == set()
    settings.MMT_CHECKPOINT_KEEP_COUNT = 3  # step 4 now protected
    answer = apply(api(admin), urls, planned["plan"])
    assert answer.status_code == 200, answer.content
    assert sorted(c["step"] for c in answer.json()["deleted"]) == [1, 3]
    [kept] = answer.json()["refused"]
    assert kept["step"] == 4 and "newest 3 complete checkpoints" in kept["reason"]
    assert deleted_steps() == {1, 3}


def test_a_previewed_checkpoint_that_became_a_resume_source_is_skipped_with_its_reason(
    api,
    admin,
    creator,
    project,
    urls,
    planned,
    seeded,  # noqa: F811
):
    RunFactory(project=project, created_by=creator, name="late-resume", source_checkpoint=seeded[3])
    answer = apply(api(admin), urls, planned["plan"])
    assert answer.status_code == 200, answer.content
    assert sorted(c["step"] for c in answer.json()["deleted"]) == [1, 4]
    [kept] = answer.json()["refused"]
    assert (kept["id"], kept["step"]) == (seeded[3].pk, 3)
    assert "source checkpoint of run late-resume" in kept["reason"]
    assert deleted_steps() == {1, 4}


def test_the_page_names_a_skipped_checkpoint_and_its_reason(client, admin, creator, project, planned, seeded):  # noqa: F811
    client.force_login(admin)
    page = client.get(f"/projects/{project.slug}/storage/", {"preview": "saved"}).content.decode()
    plan = page.split('name="plan" value="')[1].split('"')[0]
    RunFactory(project=project, created_by=creator, name="late-resume", source_checkpoint=seeded[3])
    done = client.post(f"/projects/{project.slug}/storage/apply/", {"plan": plan}, follow=True)
    text = done.content.decode()
    assert "2 checkpoints deleted" in text
    assert "Step 3 of run baseline was not deleted" in text and "source checkpoint of run late-resume" in text
    assert deleted_steps() == {1, 4}


def test_the_page_shows_the_fresh_preview_when_the_plan_changed(client, api, admin, creator, project, run, planned):
    client.force_login(admin)
    save(api(creator), run, 7)
    done = client.post(f"/projects/{project.slug}/storage/apply/", {"plan": planned["plan"]})
    assert done.status_code == 302 and done.url.endswith("?preview=saved")
    shown = client.get(done.url).content.decode()
    assert "The plan changed: review it again. Nothing was deleted." in shown
    assert "5, 4, 3, 1" in shown.split('class="going">')[1]
    assert 'name="plan"' in shown
    assert deleted_steps() == set()


def test_an_apply_submitted_twice_deletes_once(api, admin, urls, planned):
    first = apply(api(admin), urls, planned["plan"])
    second = apply(api(admin), urls, planned["plan"])
    assert first.status_code == second.status_code == 200
    assert len(first.json()["deleted"]) == 3 and second.json()["deleted"] == []
    assert all("is already deleted" in c["reason"] for c in second.json()["refused"])
    assert len(second.json()["refused"]) == 3
    assert CheckpointDeletion.objects.count() == 3


def test_apply_needs_this_projects_untouched_plan(api, admin, urls, planned):
    client = api(admin)
    missing = client.post(urls["apply"], {}, format="json")
    assert (missing.status_code, missing.json()["field"]) == (400, "plan")
    altered = apply(client, urls, planned["plan"][:-2] + "xx")
    assert (altered.status_code, altered.json()["field"]) == (400, "plan")
    other = ProjectFactory()
    MembershipFactory(user=admin, project=other, role=Role.ADMIN)
    other_url = f"/api/v1/projects/{other.slug}/retention-policy/"
    assert client.put(other_url, {"keep_last": 1}, format="json").status_code == 200
    foreign = client.post(f"{other_url}apply/", {"plan": planned["plan"]}, format="json")
    assert (foreign.status_code, foreign.json()["field"]) == (400, "plan")
    assert deleted_steps() == set()
