"""The Checkpoint tab's "Continue training from these weights": form, confirmation, launch.

docs/design/resume.md#continue, #continue-lineage. Celery is never reached (``celery_calls`` in conftest). The
source is a finished training Job whose Run recorded a data stage at step 15
(digits:v1 → synthetic:s1 added); its checkpoints sit at steps 10 and 20.
"""

import json
import re

import pytest
from django.urls import reverse

from checkpoints.models import CheckpointState
from jobs import services
from jobs.models import Job, JobKind
from runs import services as run_services
from runs.models import Run, RunKind
from runs.selectors import data_composition_at
from tests.factories import CodeVersionFactory, DatasetFactory, DatasetVersionFactory, RunFactory
from tests.jobs.conftest import checkpoint, launch


def body(response) -> str:
    return response.content.decode()


@pytest.fixture
def synthetic(project):
    dataset = DatasetFactory(project=project, name="synthetic")
    return [DatasetVersionFactory(dataset=dataset, version="s1"), DatasetVersionFactory(dataset=dataset, version="s2")]


@pytest.fixture
def finished_job(creator, code_version, cpu, dataset_versions, synthetic):
    """A fine-tuning Job on digits:v1 that added synthetic:s1 at step 15 and finished; checkpoints at 10, 20."""
    job = launch(
        creator,
        code_version,
        cpu,
        dataset_version_ids=[dataset_versions[0].pk],
        kind_of_run=RunKind.FINE_TUNING,
        parameters={"lr": 0.05, "steps": 40},
    )
    assert services.job_claim(job_id=job.pk, worker_host="gpu-1") is not None
    run_services.data_stage_record(
        actor=creator, run=job.run, start_step=15, dataset_version_ids=[dataset_versions[0].pk, synthetic[0].pk]
    )
    checkpoint(job.run, 10)
    checkpoint(job.run, 20)
    return services.job_finish(job_id=job.pk, exit_code=0)


def ckpt(job, step):
    return job.run.checkpoints.get(step=step)


def url(checkpoint_obj):
    return reverse("jobs:checkpoint-continue", args=[checkpoint_obj.pk])


def selected(html: str, name: str) -> set[int]:
    select = re.search(rf'<select name="{name}".*?</select>', html, re.S).group(0)
    return {int(v) for v in re.findall(r'<option value="(\d+)"[^>]*selected', select)}


def form_data(job, *, versions, code_version=None, **fields):
    return {
        "input_dataset_version_ids": [v.pk for v in versions],
        "code_version": (code_version or job.code_version).pk,
        "parameters": '{"lr": 0.01}',
        "queue": "cpu",
        "name": "more data",
    } | fields


@pytest.mark.parametrize("step", [10, 20])
def test_the_form_preselects_the_composition_at_the_checkpoint_step(login, member, finished_job, step):
    html = body(login(member).get(url(ckpt(finished_job, step))))
    expected = {v.pk for v in data_composition_at(run=finished_job.run, step=step)}
    assert selected(html, "input_dataset_version_ids") == expected
    assert len(expected) == (1 if step == 10 else 2)
    assert selected(html, "code_version") == {finished_job.code_version_id}
    assert json.loads(
        re.search(r'<textarea name="parameters"[^>]*>(.*?)</textarea>', html, re.S).group(1).replace("&quot;", '"')
    ) == {"lr": 0.05, "steps": 40}


def test_the_checkpoint_tab_offers_continue_on_complete_checkpoints(login, member, viewer, finished_job):
    tab = reverse("runs:run-checkpoints", args=[finished_job.run_id])
    html = body(login(member).get(tab))
    assert html.count("Continue training from these weights") == 2
    assert f'href="{url(ckpt(finished_job, 20))}"' in html
    html = body(login(viewer).get(tab))
    assert "Continue training from these weights" not in html
    assert "Your role in this project is viewer: viewers can only read." in html


def test_review_shows_what_will_run_then_launch_creates_one_continue_job(
    login, member, finished_job, dataset_versions, synthetic
):
    client = login(member)
    source = ckpt(finished_job, 20)
    chosen = [dataset_versions[0], synthetic[0], synthetic[1]]
    review = client.post(url(source), form_data(finished_job, versions=chosen))
    assert review.status_code == 200 and Job.objects.count() == 1
    html = body(review)
    summary = re.search(r'<dl class="facts continue-summary">.*?</dl>', html, re.S).group(0)
    for text in (finished_job.run.name, ">20<", "trainer v1", "synthetic</strong>:<code>s2", ">cpu<", "more data"):
        assert text in summary, text
    assert 'name="confirm"' in html and "Launch Job" in html
    response = client.post(url(source), form_data(finished_job, versions=chosen, confirm="1"))
    job = Job.objects.exclude(pk=finished_job.pk).get()
    assert response.status_code == 302 and response["Location"] == reverse("jobs:job-detail", args=[job.pk])
    assert job.kind == JobKind.CONTINUE and job.queue.name == "cpu" and job.created_by == member
    new_run = job.run
    assert set(new_run.input_dataset_versions.all()) == set(chosen)
    assert new_run.parent == finished_job.run and new_run.source_checkpoint == source
    assert new_run.kind == RunKind.FINE_TUNING and new_run.parameters == {"lr": 0.01}
    # The source Run is only read.
    assert set(finished_job.run.input_dataset_versions.all()) == {dataset_versions[0]}
    overview = body(client.get(reverse("runs:run-detail", args=[new_run.pk])))
    assert "synthetic</strong>:<code>s2" in overview


def test_change_goes_back_to_the_form_with_the_choices_kept(login, member, finished_job, synthetic):
    data = form_data(finished_job, versions=[synthetic[1]], edit="1")
    html = body(login(member).post(url(ckpt(finished_job, 20)), data))
    assert selected(html, "input_dataset_version_ids") == {synthetic[1].pk}
    assert Job.objects.count() == 1


def test_a_code_version_of_another_code_is_a_form_error(login, member, finished_job, project, synthetic):
    other = CodeVersionFactory(code__project=project, code__name="other-code", version=1)
    response = login(member).post(
        url(ckpt(finished_job, 20)), form_data(finished_job, versions=synthetic, code_version=other, confirm="1")
    )
    assert response.status_code == 400
    assert "Select a valid choice" in body(response)
    assert Job.objects.count() == 1


def test_a_source_without_code_offers_every_code_of_the_project(login, member, project, creator, code_version, cpu):
    other = CodeVersionFactory(code__project=project, code__name="other-code", version=3)
    bare = RunFactory(project=project, created_by=creator, status="finished")
    source = checkpoint(bare, 5)
    client = login(member)
    html = body(client.get(url(source)))
    assert "other-code v3" in html and "trainer v1" in html
    response = client.post(url(source), {"code_version": other.pk, "queue": "cpu", "confirm": "1"})
    job = Job.objects.get()
    assert response.status_code == 302 and job.code_version == other and job.kind == JobKind.CONTINUE


def test_bad_parameters_are_a_form_error(login, member, finished_job, synthetic):
    response = login(member).post(
        url(ckpt(finished_job, 20)), form_data(finished_job, versions=synthetic, parameters="[1]", confirm="1")
    )
    assert response.status_code == 400 and "Parameters must be a JSON object" in body(response)
    assert Job.objects.count() == 1


@pytest.mark.parametrize("state", [CheckpointState.PENDING, CheckpointState.DELETED])
def test_a_pending_or_deleted_checkpoint_is_refused(login, member, finished_job, synthetic, state):
    source = checkpoint(finished_job.run, 30, state=state)
    client = login(member)
    html = body(client.get(url(source)))
    assert "Only a complete checkpoint can be continued from" in html and 'name="parameters"' not in html
    response = client.post(url(source), form_data(finished_job, versions=synthetic, confirm="1"))
    assert response.status_code == 409
    assert Job.objects.count() == 1


def test_a_viewer_sees_the_reason_and_a_post_is_403(login, viewer, finished_job, synthetic):
    client = login(viewer)
    html = body(client.get(url(ckpt(finished_job, 20))))
    assert "Your role in this project is viewer: viewers can only read." in html and 'name="parameters"' not in html
    response = client.post(url(ckpt(finished_job, 20)), form_data(finished_job, versions=synthetic, confirm="1"))
    assert response.status_code == 403
    assert Job.objects.count() == 1


def test_an_outsider_gets_404_and_anonymous_the_login_page(client, login, outsider, finished_job, synthetic):
    target = url(ckpt(finished_job, 20))
    for method in ("get", "post"):
        response = getattr(client, method)(target)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login") + "?next=")
    outsider_client = login(outsider)
    assert outsider_client.get(target).status_code == 404
    assert outsider_client.post(target, form_data(finished_job, versions=synthetic, confirm="1")).status_code == 404
    assert Job.objects.count() == 1 and Run.objects.count() == 1


def test_another_projects_dataset_version_is_refused(login, member, finished_job, other_project):
    foreign = DatasetVersionFactory(dataset=DatasetFactory(project=other_project, name="secret"))
    response = login(member).post(url(ckpt(finished_job, 20)), form_data(finished_job, versions=[foreign], confirm="1"))
    assert response.status_code == 400 and Job.objects.count() == 1
