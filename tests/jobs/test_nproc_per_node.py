"""Processes per node of a Job (docs/design/worker.md#distributed): launch, resume and continue take it (API and pages),
a retry keeps it, a resume defaults to the source's and its form offers the checkpoint's world size, saying DCP
reshards."""

import pytest
from django.urls import reverse

from jobs.models import Job
from jobs.services import job_retry_from_scratch, run_continue_from_checkpoint
from tests.jobs.conftest import body, checkpoint, launch, run_to_end


@pytest.fixture
def two_process_failure(creator, code_version, cpu):
    """A failed 2-process Job with a sharded checkpoint at step 20 (world size 2)."""
    job = run_to_end(launch(creator, code_version, cpu, nproc_per_node=2, max_retries=1), exit_code=1)
    sharded = checkpoint(job.run, 20)
    sharded.framework, sharded.world_size = "torch-dcp", 2
    sharded.save(update_fields=["framework", "world_size"])
    return job, sharded


def test_the_api_launches_with_processes_per_node(client_as, code_version, cpu):
    response = client_as("member").post(
        "/api/v1/jobs/", {"code_version_id": code_version.pk, "nproc_per_node": 4}, format="json"
    )
    assert response.status_code == 201, response.content
    assert (response.json()["nproc_per_node"], response.json()["nnodes"]) == (4, 1)
    assert Job.objects.get().nproc_per_node == 4


@pytest.mark.parametrize("value", [0, -1, 257, "two", 1.5, True, None])
def test_a_bad_process_count_is_refused_naming_the_field(client_as, code_version, cpu, value):
    response = client_as("member").post(
        "/api/v1/jobs/", {"code_version_id": code_version.pk, "nproc_per_node": value}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "nproc_per_node" and not Job.objects.exists()


def test_a_resume_keeps_the_source_count_unless_another_is_given(client_as, two_process_failure):
    job, sharded = two_process_failure
    client = client_as("creator")
    same = client.post(f"/api/v1/jobs/{job.pk}/resume-latest/", {}, format="json")
    assert same.status_code == 201 and same.json()["nproc_per_node"] == 2
    run_to_end(Job.objects.get(pk=same.json()["id"]), exit_code=1)
    other = client.post(f"/api/v1/checkpoints/{sharded.pk}/resume/", {"nproc_per_node": 1}, format="json")
    assert other.status_code == 201 and other.json()["nproc_per_node"] == 1
    refused = client.post(f"/api/v1/checkpoints/{sharded.pk}/resume/", {"nproc_per_node": 0}, format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "nproc_per_node"


def test_an_automatic_retry_keeps_the_process_count(two_process_failure):
    job, _ = two_process_failure
    assert job_retry_from_scratch(job=job).nproc_per_node == 2


def test_a_continue_defaults_to_the_source_count(creator, code_version, cpu, two_process_failure):
    _, sharded = two_process_failure
    arguments = dict(actor=creator, checkpoint=sharded, code_version=code_version, queue=cpu, dataset_version_ids=[])
    assert run_continue_from_checkpoint(**arguments).nproc_per_node == 2
    assert run_continue_from_checkpoint(**arguments, nproc_per_node=3).nproc_per_node == 3


def test_the_resume_form_offers_the_checkpoint_world_size_and_says_it_reshards(login, creator, two_process_failure):
    _, sharded = two_process_failure
    url = reverse("jobs:checkpoint-resume", args=[sharded.pk])
    html = body(login(creator).get(url))
    assert 'name="nproc_per_node" value="2"' in html
    assert "saved by 2 process(es)" in html and "reshards the saved state" in html
    assert "sharded by 2 processes" in html
    answer = login(creator).post(url, {"queue": "cpu", "nproc_per_node": "1"})
    assert answer.status_code == 302
    assert Job.objects.order_by("-pk").first().nproc_per_node == 1


def test_the_launch_page_takes_processes_per_node(login, creator, code_version, cpu):
    url = reverse("jobs:job-launch", args=["vision"])
    form = {
        "code_version": code_version.pk,
        "queue": "cpu",
        "parameters": "{}",
        "kind": "training",
        "max_retries": 0,
        "name": "ddp",
    }
    assert login(creator).post(url, {**form, "nproc_per_node": "0"}).status_code == 400
    assert login(creator).post(url, {**form, "nproc_per_node": "2"}).status_code == 302
    assert Job.objects.get().nproc_per_node == 2
    html = body(login(creator).get(reverse("jobs:job-detail", args=[Job.objects.get().pk])))
    assert "2 under torchrun" in html


def test_the_resume_form_speaks_japanese(login, creator, two_process_failure, settings):
    _, sharded = two_process_failure
    client = login(creator)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    html = body(client.get(reverse("jobs:checkpoint-resume", args=[sharded.pk])))
    assert "ノードあたりのプロセス数" in html and "2 プロセスで保存されました" in html
    assert "2 プロセスで分割保存" in html
