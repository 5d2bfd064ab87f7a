"""Jobs pages: Launch Job, Jobs list, a Job, abort, resume from latest / a checkpoint, logs, lineage.

docs/design/resume.md; docs/design/worker.md#refusal, #subprocess. Celery is never reached (``celery_calls`` in
conftest records ``send_task``); checkpoints are rows made by ``checkpoint()``.
"""

import re

import pytest
from django.urls import reverse

from jobs import services
from jobs.models import Job, JobKind, JobStatus
from runs.models import RunStatus
from tests.factories import CodeVersionFactory
from tests.jobs.conftest import body, checkpoint, launch, run_to_end

RESUME_SENTENCE = "Training will resume as a new Run from the checkpoint at step {}."


def row(html: str, job: Job) -> str:
    """The Jobs list's ``<tr>`` of ``job``."""
    match = re.search(rf'<tr data-job="{job.pk}".*?</tr>', html, re.S)
    assert match, f"no row for job {job.pk}"
    return match.group(0)


def jobs_url(slug="vision"):
    return reverse("jobs:project-jobs", args=[slug])


# --- access -------------------------------------------------------------------------------------


def _urls(job, ckpt):
    return [
        ("get", reverse("jobs:project-jobs", args=["vision"])),
        ("get", reverse("jobs:project-jobs-table", args=["vision"])),
        ("get", reverse("jobs:job-launch", args=["vision"])),
        ("get", reverse("jobs:job-detail", args=[job.pk])),
        ("get", reverse("jobs:job-live", args=[job.pk])),
        ("get", reverse("jobs:checkpoint-resume", args=[ckpt.pk])),
        ("get", reverse("jobs:run-log", args=[job.run_id])),
        ("post", reverse("jobs:job-abort", args=[job.pk])),
        ("post", reverse("jobs:job-resume-latest", args=[job.pk])),
        ("post", reverse("jobs:checkpoint-resume", args=[ckpt.pk])),
    ]


def test_anonymous_is_sent_to_the_login_page(client, failed_job):
    ckpt = checkpoint(failed_job.run, 20)
    for method, url in _urls(failed_job, ckpt):
        response = getattr(client, method)(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login") + "?next="), url
    assert Job.objects.count() == 1


def test_an_outsider_gets_404_everywhere(login, outsider, failed_job):
    ckpt = checkpoint(failed_job.run, 20)
    client = login(outsider)
    for method, url in _urls(failed_job, ckpt):
        assert getattr(client, method)(url).status_code == 404, url
    assert Job.objects.count() == 1
    failed_job.refresh_from_db()
    assert failed_job.status == JobStatus.FAILED


@pytest.mark.parametrize("role", ["admin", "member", "creator", "viewer"])
def test_every_role_sees_the_jobs_pages(login, request, failed_job, role):
    client = login(request.getfixturevalue(role))
    for name, args in [("project-jobs", ["vision"]), ("job-detail", [failed_job.pk]), ("job-live", [failed_job.pk])]:
        assert client.get(reverse(f"jobs:{name}", args=args)).status_code == 200, name


def test_the_project_page_links_the_jobs_list(login, viewer, project):
    assert f'href="{jobs_url()}"' in body(login(viewer).get(reverse("runs:project-detail", args=["vision"])))


# --- Launch Job (docs/design/resume.md#retry) -------------------------------------------------------------------------


def launch_data(code_version, queue, **fields):
    return {
        "code_version": code_version.pk,
        "parameters": '{"lr": 0.01}',
        "queue": queue.name,
        "name": "first",
        "kind": "training",
        "max_retries": "0",
    } | fields


def test_the_launch_form_offers_code_versions_queues_datasets_and_explains_retries(
    login, creator, code_version, cpu, gpu, dataset_versions
):
    html = body(login(creator).get(reverse("jobs:job-launch", args=["vision"])))
    assert "trainer v1" in html and "digits:v1" in html and "digits:v2" in html
    assert 'value="cpu" selected' in html and 'value="gpu-a100"' in html
    assert 'name="max_retries" value="0"' in html
    assert "A retry starts the code again from scratch, without any checkpoint." in html


def test_launching_creates_a_queued_job_and_opens_its_page(
    login, creator, code_version, gpu, dataset_versions, celery_calls, django_capture_on_commit_callbacks
):
    data = launch_data(code_version, gpu, input_dataset_version_ids=[dataset_versions[1].pk], max_retries="2")
    with django_capture_on_commit_callbacks(execute=True):
        response = login(creator).post(reverse("jobs:job-launch", args=["vision"]), data)
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("jobs:job-detail", args=[job.pk])
    assert (job.kind, job.status, job.queue.name, job.max_retries) == (JobKind.NEW, JobStatus.QUEUED, "gpu-a100", 2)
    assert job.run.parameters == {"lr": 0.01} and job.run.name == "first" and job.run.status == RunStatus.PENDING
    assert list(job.run.input_dataset_versions.all()) == [dataset_versions[1]]
    assert celery_calls.sent == [
        {"name": "worker.tasks.run_job", "args": [job.pk], "queue": "gpu-a100", "task_id": job.celery_task_id}
    ]


@pytest.mark.parametrize(
    "parameters, message",
    [
        ('{"lr": 0.01', "Not valid JSON"),
        ("[1, 2]", "Parameters must be a JSON object"),
        ('"lr"', "Parameters must be a JSON object"),
    ],
)
def test_bad_parameters_are_a_form_error_naming_the_field(login, creator, code_version, cpu, parameters, message):
    response = login(creator).post(
        reverse("jobs:job-launch", args=["vision"]), launch_data(code_version, cpu, parameters=parameters)
    )
    assert response.status_code == 400
    assert f"Parameters: {message}" in body(response)
    assert parameters.replace('"', "&quot;") in body(response)  # what was typed is kept
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_retries", "11", "Max retries: Ensure this value is less than or equal to 10."),
        ("max_retries", "-1", "Max retries: Ensure this value is greater than or equal to 0."),
        ("queue", "nowhere", "Queue: Select a valid choice."),
    ],
)
def test_other_bad_fields_are_named(login, creator, code_version, cpu, field, value, message):
    response = login(creator).post(
        reverse("jobs:job-launch", args=["vision"]), launch_data(code_version, cpu) | {field: value}
    )
    assert response.status_code == 400 and message in body(response)
    assert not Job.objects.exists()


def test_a_disabled_queue_is_not_offered(login, creator, code_version, cpu, gpu):
    gpu.enabled = False
    gpu.save()
    client = login(creator)
    assert "gpu-a100" not in body(client.get(reverse("jobs:job-launch", args=["vision"])))
    response = client.post(reverse("jobs:job-launch", args=["vision"]), launch_data(code_version, gpu))
    assert response.status_code == 400 and "Queue: Select a valid choice." in body(response)


def test_a_code_version_of_another_project_cannot_be_launched(login, creator, code_version, cpu, other_project):
    foreign = CodeVersionFactory(code__project=other_project)
    response = login(creator).post(reverse("jobs:job-launch", args=["vision"]), launch_data(foreign, cpu))
    assert response.status_code == 400 and "Code version: Select a valid choice." in body(response)
    assert not Job.objects.exists()


def test_a_viewer_sees_why_instead_of_the_form_and_cannot_post(login, viewer, code_version, cpu):
    client = login(viewer)
    html = body(client.get(reverse("jobs:job-launch", args=["vision"])))
    assert "Your role in this project is viewer" in html and 'name="parameters"' not in html
    assert "Launch Job</a>" not in body(client.get(jobs_url()))
    response = client.post(reverse("jobs:job-launch", args=["vision"]), launch_data(code_version, cpu))
    assert response.status_code == 403 and not Job.objects.exists()


# --- the Jobs list (docs/design/resume.md#from-a-checkpoint, #latest-checkpoint) --------------------------------------


def test_the_list_shows_status_kind_queue_creator_attempt_and_links(login, viewer, failed_job):
    html = body(login(viewer).get(jobs_url()))
    tr = row(html, failed_job)
    assert 'data-status="failed"' in tr and 'data-kind="new"' in tr
    assert "cpu" in tr and "carol-creator" in tr
    assert f'href="{reverse("jobs:job-detail", args=[failed_job.pk])}"' in tr
    assert f'href="{reverse("runs:run-detail", args=[failed_job.run_id])}"' in tr


def test_resumed_retry_and_continued_jobs_have_their_badges(login, viewer, creator, code_version, cpu, failed_job):
    resumed = services.run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint(failed_job.run, 20))
    retried = run_to_end(launch(creator, code_version, cpu, max_retries=1), exit_code=1).retries.get()
    continued = Job.objects.get(pk=resumed.pk)
    Job.objects.filter(pk=continued.pk).update(kind=JobKind.CONTINUE)  # the continue service is tested elsewhere
    html = body(login(viewer).get(jobs_url()))
    assert re.search(r'class="badge kind kind-continue" data-kind="continue">continued<', row(html, continued))
    assert re.search(r'class="badge kind kind-retry" data-kind="retry">retry<', row(html, retried))
    assert "2 of 2" in row(html, retried)
    Job.objects.filter(pk=continued.pk).update(kind=JobKind.RESUME)
    html = body(login(viewer).get(jobs_url()))
    assert re.search(r'class="badge kind kind-resume" data-kind="resume">resumed<', row(html, resumed))


def test_the_creator_gets_resume_from_latest_on_a_failed_job(login, creator, failed_job):
    checkpoint(failed_job.run, 20)
    tr = row(body(login(creator).get(jobs_url())), failed_job)
    assert f'href="{reverse("jobs:job-resume-latest", args=[failed_job.pk])}"' in tr  # a link to the confirmation
    assert "Resume from latest checkpoint" in tr


@pytest.mark.parametrize(
    "role, sentence",
    [
        ("viewer", "Your role in this project is viewer: viewers can only read."),
        ("member", "This is not your run: only its creator and project admins can stop, rerun or resume its Job."),
    ],
)
def test_others_see_the_reason_instead_of_the_resume_button(login, request, failed_job, role, sentence):
    checkpoint(failed_job.run, 20)
    tr = row(body(login(request.getfixturevalue(role)).get(jobs_url())), failed_job)
    assert sentence in tr
    assert "Resume from latest checkpoint" not in tr and "job-resume-latest" not in tr


def test_a_failed_job_without_a_checkpoint_says_so(login, creator, failed_job):
    tr = row(body(login(creator).get(jobs_url())), failed_job)
    assert "The run has no complete checkpoint to resume from." in tr
    assert "Resume from latest checkpoint" not in tr


def test_a_finished_job_says_use_continue(login, creator, code_version, cpu):
    job = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    checkpoint(job.run, 20)
    tr = row(body(login(creator).get(jobs_url())), job)
    assert "The run finished: use “Continue training from these weights” instead of resume." in tr
    assert "Resume from latest checkpoint" not in tr and "Abort" not in tr


def test_a_queued_job_says_it_has_not_started_rather_than_that_its_run_is_running(login, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    tr = row(body(login(creator).get(jobs_url())), job)
    assert "Job has not started yet: it can be resumed once it has failed or been aborted." in tr
    assert "still running" not in tr


def test_a_running_job_has_abort_for_its_creator_and_says_it_is_still_running(
    login, creator, member, code_version, cpu
):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    tr = row(body(login(creator).get(jobs_url())), job)
    assert f'action="{reverse("jobs:job-abort", args=[job.pk])}"' in tr
    assert "The run is still running: it can be resumed once its Job has failed or been aborted." in tr
    tr = row(body(login(member).get(jobs_url())), job)
    assert "job-abort" not in tr and "This is not your run" in tr


def test_the_list_polls_while_a_job_is_not_final_and_stops_after(login, viewer, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    client = login(viewer)
    table = reverse("jobs:project-jobs-table", args=["vision"])
    live = body(client.get(table))
    assert f'hx-get="{table}"' in live and re.search(r'hx-trigger="every [345]s"', live) and "<html" not in live
    assert f'hx-get="{table}"' in body(client.get(jobs_url()))
    run_to_end(job, exit_code=1)
    final = body(client.get(table))
    assert "hx-get" not in final and 'data-status="failed"' in final


def test_an_empty_project_says_how_to_start(login, creator, project):
    assert "No Jobs in this project yet" in body(login(creator).get(jobs_url()))


# --- resume from latest (docs/design/resume.md#latest-checkpoint) and abort -------------------------------------------


def test_resume_from_latest_creates_one_job_even_when_posted_twice(login, creator, failed_job):
    checkpoint(failed_job.run, 10)
    latest = checkpoint(failed_job.run, 20)
    client = login(creator)
    url = reverse("jobs:job-resume-latest", args=[failed_job.pk])
    first = client.post(url, {"next": jobs_url()})
    new = Job.objects.get(kind=JobKind.RESUME)
    assert first["Location"] == reverse("jobs:job-detail", args=[new.pk])
    assert new.run.source_checkpoint == latest and new.run.parent == failed_job.run
    second = client.post(url, {"next": jobs_url()}, follow=True)
    assert second.status_code == 200 and second.redirect_chain[-1][0] == jobs_url()
    html = body(second)
    assert "A resume of this run is already queued or running:" in html
    assert f'<a href="{reverse("jobs:job-detail", args=[new.pk])}">Job {new.pk}</a>' in html
    assert Job.objects.filter(kind=JobKind.RESUME).count() == 1


def test_a_run_being_resumed_links_the_resume_instead_of_the_button(login, creator, failed_job):
    checkpoint(failed_job.run, 20)
    new = services.job_resume_from_latest(actor=creator, job=failed_job)
    client = login(creator)
    link = f'<a href="{reverse("jobs:job-detail", args=[new.pk])}">Job {new.pk}</a>'
    for html in (
        row(body(client.get(jobs_url())), failed_job),
        body(client.get(reverse("jobs:job-detail", args=[failed_job.pk]))),
    ):
        assert "A resume of this run is already queued or running:" in html and link in html
        assert "Resume from latest checkpoint" not in html
    run_to_end(new, exit_code=1)  # the resume failed too: the source may be resumed again
    assert "Resume from latest checkpoint" in row(body(client.get(jobs_url())), failed_job)


def test_resume_from_latest_by_a_member_who_is_not_the_creator_is_forbidden(login, member, failed_job):
    checkpoint(failed_job.run, 20)
    assert login(member).post(reverse("jobs:job-resume-latest", args=[failed_job.pk])).status_code == 403
    assert not Job.objects.filter(kind=JobKind.RESUME).exists()


def test_resume_from_latest_without_a_checkpoint_is_a_message_not_an_error(login, creator, failed_job):
    response = login(creator).post(reverse("jobs:job-resume-latest", args=[failed_job.pk]), follow=True)
    assert response.status_code == 200
    assert "The run has no complete checkpoint to resume from." in body(response)


def test_the_creator_aborts_a_queued_job(
    login, creator, code_version, cpu, celery_calls, django_capture_on_commit_callbacks
):
    job = launch(creator, code_version, cpu)
    with django_capture_on_commit_callbacks(execute=True):
        response = login(creator).post(reverse("jobs:job-abort", args=[job.pk]), {"next": jobs_url()})
    assert response["Location"] == jobs_url()
    job.refresh_from_db()
    assert job.status == JobStatus.ABORTED and job.run.status == RunStatus.ABORTED
    assert celery_calls.revoked == [job.celery_task_id]


def test_aborting_a_running_job_requests_it(login, admin, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    response = login(admin).post(reverse("jobs:job-abort", args=[job.pk]), follow=True)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.abort_requested_at is not None
    assert "Abort of Job" in body(response) and "abort requested" in body(response)


def test_abort_by_a_non_creator_member_is_forbidden_and_an_ended_job_gets_a_message(
    login, member, creator, code_version, cpu, failed_job
):
    job = launch(creator, code_version, cpu)
    assert login(member).post(reverse("jobs:job-abort", args=[job.pk])).status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    response = login(creator).post(reverse("jobs:job-abort", args=[failed_job.pk]), follow=True)
    assert response.status_code == 200 and "there is nothing to abort" in body(response)


def test_an_unsafe_next_is_ignored(login, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    response = login(creator).post(reverse("jobs:job-abort", args=[job.pk]), {"next": "https://evil.example/"})
    assert response["Location"] == reverse("jobs:job-detail", args=[job.pk])


# --- the Job page (docs/design/worker.md#refusal, #subprocess) --------------------------------------------------------


def test_the_job_page_shows_the_error_facts_and_log(login, viewer, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="gpu-node-7")
    services.job_append_log(job_id=job.pk, text="step 0 loss 2.30\n")
    services.job_append_log(job_id=job.pk, text="step 1 loss <2.10>\n")
    error = "Checkpoint 12 sha256 mismatch: model.pt is abc…, the manifest says def…"
    services.job_finish(job_id=job.pk, exit_code=None, error=error)
    html = body(login(viewer).get(reverse("jobs:job-detail", args=[job.pk])))
    assert error in html and "gpu-node-7" in html and "trainer v1" in html
    assert "step 0 loss 2.30\nstep 1 loss &lt;2.10&gt;\n" in html
    assert f'href="{reverse("runs:run-detail", args=[job.run_id])}"' in html
    assert 'data-live="false"' in html and "hx-get" not in html


def test_the_job_page_shows_the_exit_code(login, viewer, failed_job):
    html = body(login(viewer).get(reverse("jobs:job-detail", args=[failed_job.pk])))
    assert '<dd class="exit-code"><code>1</code></dd>' in html and "The code exited with code 1." in html


def test_the_job_page_polls_while_running(login, viewer, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    services.job_append_log(job_id=job.pk, text="hello\n")
    client = login(viewer)
    live_url = reverse("jobs:job-live", args=[job.pk])
    assert f'hx-get="{live_url}"' in body(client.get(reverse("jobs:job-detail", args=[job.pk])))
    partial = body(client.get(live_url))
    assert "<html" not in partial and "hello" in partial and f'hx-get="{live_url}"' in partial


def test_the_job_page_of_a_resume_shows_its_lineage(login, viewer, creator, failed_job):
    ckpt = checkpoint(failed_job.run, 20)
    new = services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt)
    html = body(login(viewer).get(reverse("jobs:job-detail", args=[new.pk])))
    assert "Resumed from run" in html and f'href="{reverse("runs:run-detail", args=[failed_job.run_id])}"' in html
    assert f'href="{reverse("checkpoints:checkpoint-detail", args=[ckpt.pk])}">step 20<' in html
    assert 'data-kind="resume">resumed<' in html


def test_the_job_page_shows_the_resume_reason_or_button(login, creator, member, failed_job):
    checkpoint(failed_job.run, 20)
    url = reverse("jobs:job-detail", args=[failed_job.pk])
    assert "Resume from latest checkpoint" in body(login(creator).get(url))
    html = body(login(member).get(url))
    assert "This is not your run" in html and "Resume from latest checkpoint" not in html
