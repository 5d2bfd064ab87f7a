"""The Run page's "Training data history" tab and "Record data change" form; data stage chart markers.

docs/design/runs.md#data-stages. Stages are recorded with ``runs.services.data_stage_record``.
"""

import re

import pytest
from django.urls import reverse

from checkpoints.models import Checkpoint, CheckpointState
from runs import services
from runs.metrics import metrics_ingest
from runs.models import DataStage, RunStatus
from tests.factories import DatasetFactory, DatasetVersionFactory, RunFactory


@pytest.fixture
def versions(project):
    """digits:v1 and digits:v2 plus synthetic:s1."""
    digits = DatasetFactory(project=project, name="digits")
    synthetic = DatasetFactory(project=project, name="synthetic")
    return {
        "v1": DatasetVersionFactory(dataset=digits, version="v1"),
        "v2": DatasetVersionFactory(dataset=digits, version="v2"),
        "s1": DatasetVersionFactory(dataset=synthetic, version="s1"),
    }


@pytest.fixture
def staged_run(run, creator, versions):
    """``run`` (running) started on digits:v1; at step 100 synthetic:s1 was added, at 200 digits:v1 → v2."""
    run.input_dataset_versions.set([versions["v1"]])
    ckpt = Checkpoint.objects.create(run=run, step=100, state=CheckpointState.COMPLETE, file_count=1, total_bytes=1)
    services.data_stage_record(
        actor=creator,
        run=run,
        start_step=100,
        checkpoint_id=ckpt.pk,
        dataset_version_ids=[versions["v1"].pk, versions["s1"].pk],
        metadata={"note": "add synthetic"},
    )
    services.data_stage_record(
        actor=creator, run=run, start_step=200, dataset_version_ids=[versions["v2"].pk, versions["s1"].pk]
    )
    return run


def url(run):
    return reverse("runs:run-data-history", args=[run.pk])


def body(response) -> str:
    return response.content.decode()


def stage_row(html: str, step: int) -> str:
    match = re.search(rf'<tr data-step="{step}".*?</tr>', html, re.S)
    assert match, f"no row for step {step}"
    return match.group(0)


def selected_ids(html: str, name: str) -> set[int]:
    select = re.search(rf'<select name="{name}".*?</select>', html, re.S).group(0)
    return {int(v) for v in re.findall(r'<option value="(\d+)"[^>]*selected', select)}


def test_the_tab_shows_the_starting_composition_and_a_diff_row_per_stage(login, viewer, staged_run, versions):
    html = body(login(viewer).get(url(staged_run)))
    start = re.search(r'<section class="card initial-composition">.*?</section>', html, re.S).group(0)
    assert "digits</strong>:<code>v1" in start and "synthetic" not in start
    first, second = stage_row(html, 100), stage_row(html, 200)
    assert html.index('data-step="100"') < html.index('data-step="200"')
    assert f'class="added" data-version="{versions["s1"].pk}"' in first
    assert 'class="removed"' not in first
    assert "add synthetic" in first and "carol-creator" in first
    assert reverse("checkpoints:checkpoint-detail", args=[Checkpoint.objects.get().pk]) in first
    assert f'class="added" data-version="{versions["v2"].pk}"' in second
    assert f'class="removed" data-version="{versions["v1"].pk}"' in second


def test_an_empty_history_says_so(login, creator, run):
    assert "No data changes have been recorded for this run." in body(login(creator).get(url(run)))


def test_the_form_is_preloaded_with_the_current_composition(login, creator, staged_run, versions):
    html = body(login(creator).get(url(staged_run)))
    assert "Record data change" in html
    assert selected_ids(html, "input_dataset_version_ids") == {versions["v2"].pk, versions["s1"].pk}
    # Only this Run's complete checkpoints are offered.
    assert re.search(r'<select name="checkpoint".*?step 100.*?</select>', html, re.S)


def test_recording_a_change_adds_a_row_and_never_touches_the_initial_inputs(login, creator, staged_run, versions):
    client = login(creator)
    response = client.post(
        url(staged_run),
        {
            "start_step": "300",
            "input_dataset_version_ids": [versions["v2"].pk],
            "note": "drop synthetic",
        },
    )
    assert response.status_code == 302 and response["Location"] == url(staged_run)
    stage = DataStage.objects.get(run=staged_run, start_step=300)
    assert list(stage.dataset_versions.all()) == [versions["v2"]]
    assert stage.metadata == {"note": "drop synthetic"} and stage.created_by == creator
    assert list(staged_run.input_dataset_versions.all()) == [versions["v1"]]
    html = body(client.get(url(staged_run)))
    assert "The data change at step 300 was recorded." in html
    assert f'class="removed" data-version="{versions["s1"].pk}"' in stage_row(html, 300)


def test_a_different_set_at_a_recorded_step_is_a_conflict_shown_on_the_form(login, creator, staged_run, versions):
    response = login(creator).post(
        url(staged_run),
        {
            "start_step": "200",
            "input_dataset_version_ids": [versions["v1"].pk],
        },
    )
    assert response.status_code == 409
    assert "step 200 already has a data stage" in body(response)
    assert DataStage.objects.filter(run=staged_run).count() == 2


def test_an_empty_set_or_an_earlier_step_is_a_form_error(login, creator, staged_run, versions):
    client = login(creator)
    response = client.post(url(staged_run), {"start_step": "300"})
    assert response.status_code == 400 and "This field is required." in body(response)
    response = client.post(url(staged_run), {"start_step": "150", "input_dataset_version_ids": [versions["v1"].pk]})
    assert response.status_code == 400 and "greater than the previous stage" in body(response)
    assert DataStage.objects.filter(run=staged_run).count() == 2


def test_a_viewer_sees_the_reason_and_a_post_is_403(login, viewer, staged_run, versions):
    client = login(viewer)
    html = body(client.get(url(staged_run)))
    assert "Your role in this project is viewer: viewers can only read." in html
    assert 'name="start_step"' not in html
    response = client.post(url(staged_run), {"start_step": "300", "input_dataset_version_ids": [versions["v1"].pk]})
    assert response.status_code == 403
    assert DataStage.objects.filter(run=staged_run).count() == 2


def test_a_finished_run_shows_the_reason_and_refuses_a_record(login, creator, staged_run, versions):
    staged_run.status = RunStatus.FINISHED
    staged_run.save(update_fields=["status"])
    client = login(creator)
    html = body(client.get(url(staged_run)))
    assert 'class="resume-note record-refusal"' in html and "The Job has ended" in html
    assert 'name="start_step"' not in html
    response = client.post(url(staged_run), {"start_step": "300", "input_dataset_version_ids": [versions["v1"].pk]})
    assert response.status_code == 409
    assert DataStage.objects.filter(run=staged_run).count() == 2


def test_an_outsider_gets_404_and_anonymous_the_login_page(client, login, outsider, staged_run):
    response = client.get(url(staged_run))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert client.post(url(staged_run), {"start_step": "5"}).status_code == 302
    outsider_client = login(outsider)
    assert outsider_client.get(url(staged_run)).status_code == 404
    assert outsider_client.post(url(staged_run), {"start_step": "5"}).status_code == 404


def test_another_projects_dataset_version_is_not_offered_nor_accepted(login, creator, staged_run, other_project):
    foreign = DatasetVersionFactory(dataset=DatasetFactory(project=other_project, name="secret"))
    client = login(creator)
    assert "secret" not in body(client.get(url(staged_run)))
    response = client.post(url(staged_run), {"start_step": "300", "input_dataset_version_ids": [foreign.pk]})
    assert response.status_code == 400
    assert not DataStage.objects.filter(start_step=300).exists()


def test_the_charts_mark_each_data_stage_at_its_start_step(login, creator, staged_run):
    metrics_ingest(
        actor=creator,
        run=staged_run,
        points=[{"key": "train.loss", "value": 1.0 / (step + 1), "step": step} for step in range(0, 260, 10)],
    )
    client = login(creator)
    for page in (reverse("runs:run-detail", args=[staged_run.pk]), reverse("runs:run-charts", args=[staged_run.pk])):
        html = body(client.get(page))
        markers = re.findall(r'<li class="data-stage-marker" data-step="(\d+)">([^<]*)</li>', html)
        assert markers == [
            ("100", "Data change at step 100: +synthetic:s1"),
            ("200", "Data change at step 200: +digits:v2 −digits:v1"),
        ]


def test_a_marker_outside_the_logged_steps_is_not_drawn(login, creator, staged_run):
    metrics_ingest(actor=creator, run=staged_run, points=[{"key": "acc", "value": 0.5, "step": s} for s in (0, 50)])
    html = body(login(creator).get(reverse("runs:run-detail", args=[staged_run.pk])))
    assert "data-stage-marker" not in html


def test_another_run_without_stages_has_no_markers(login, creator, project):
    other = RunFactory(project=project, created_by=creator)
    metrics_ingest(actor=creator, run=other, points=[{"key": "acc", "value": 0.5, "step": s} for s in (0, 500)])
    assert "data-stage-marker" not in body(login(creator).get(reverse("runs:run-detail", args=[other.pk])))
