"""Jobs pages: Launch Job, Jobs list, a Job, abort, resume from latest / a checkpoint, logs, lineage (issue 4 part 5).

SPEC F2, F6–F11, F15, F16. Celery is never reached (``celery_calls`` in
conftest records ``send_task``); checkpoints are rows made by ``checkpoint()``.
"""

import re

import pytest
from django.urls import reverse

from checkpoints.models import CheckpointState
from jobs import services
from jobs.models import Job, JobKind, JobStatus
from runs.metrics import metrics_ingest
from runs.models import Run, RunStatus
from tests.factories import CodeVersionFactory, RunFactory
from tests.jobs.conftest import checkpoint, launch, run_to_end

RESUME_SENTENCE = "Training will resume as a new Run from the checkpoint at step {}."


@pytest.fixture
def login(client):
    def as_user(user):
        client.force_login(user)
        return client

    return as_user


def body(response) -> str:
    return response.content.decode()


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


# --- Launch Job (F11) -----------------------------------------------------------------------------


def launch_data(code_version, queue, **fields):
    return {"code_version": code_version.pk, "parameters": '{"lr": 0.01}', "queue": queue.name, "name": "first",
            "kind": "training", "max_retries": "0"} | fields


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
    assert celery_calls.sent == [{"name": "worker.tasks.run_job", "args": [job.pk], "queue": "gpu-a100",
                                  "task_id": job.celery_task_id}]


@pytest.mark.parametrize("parameters, message", [
    ('{"lr": 0.01', "Not valid JSON"),
    ("[1, 2]", "Parameters must be a JSON object"),
    ('"lr"', "Parameters must be a JSON object"),
])
def test_bad_parameters_are_a_form_error_naming_the_field(login, creator, code_version, cpu, parameters, message):
    response = login(creator).post(
        reverse("jobs:job-launch", args=["vision"]), launch_data(code_version, cpu, parameters=parameters)
    )
    assert response.status_code == 400
    assert f"Parameters: {message}" in body(response)
    assert parameters.replace('"', "&quot;") in body(response)  # what was typed is kept
    assert not Job.objects.exists()


@pytest.mark.parametrize("field, value, message", [
    ("max_retries", "11", "Max retries: Ensure this value is less than or equal to 10."),
    ("max_retries", "-1", "Max retries: Ensure this value is greater than or equal to 0."),
    ("queue", "nowhere", "Queue: Select a valid choice."),
])
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


# --- the Jobs list (F7, F8) ---------------------------------------------------------------------------


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
    Job.objects.filter(pk=continued.pk).update(kind=JobKind.CONTINUE)  # the continue service is issue 5's
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
    assert f'action="{reverse("jobs:job-resume-latest", args=[failed_job.pk])}"' in tr
    assert "Resume from latest checkpoint" in tr


@pytest.mark.parametrize("role, sentence", [
    ("viewer", "Your role in this project is viewer: viewers can only read."),
    ("member", "This is not your run: only its creator and project admins can stop, rerun or resume its Job."),
])
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


# --- resume from latest (F8) and abort ----------------------------------------------------------------


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
    for html in (row(body(client.get(jobs_url())), failed_job),
                 body(client.get(reverse("jobs:job-detail", args=[failed_job.pk])))):
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


def test_the_creator_aborts_a_queued_job(login, creator, code_version, cpu, celery_calls,
                                         django_capture_on_commit_callbacks):
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


# --- the Job page (F15, F16) ---------------------------------------------------------------------------


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


# --- "Resume from this checkpoint" (F7) --------------------------------------------------------------------


def tab(run):
    return reverse("runs:run-checkpoints", args=[run.pk])


def test_the_checkpoint_tab_has_resume_for_the_creator(login, creator, failed_job):
    ckpt = checkpoint(failed_job.run, 20)
    html = body(login(creator).get(tab(failed_job.run)))
    assert f'href="{reverse("jobs:checkpoint-resume", args=[ckpt.pk])}"' in html
    assert "Resume from this checkpoint" in html


@pytest.mark.parametrize("role, sentence", [
    ("viewer", "Your role in this project is viewer"),
    ("member", "This is not your run"),
])
def test_the_checkpoint_tab_shows_others_the_reason(login, request, failed_job, role, sentence):
    checkpoint(failed_job.run, 20)
    html = body(login(request.getfixturevalue(role)).get(tab(failed_job.run)))
    assert sentence in html and "Resume from this checkpoint" not in html


def test_the_checkpoint_tab_of_a_run_without_a_job_or_a_finished_run_says_why(
    login, creator, project, code_version, cpu
):
    plain = RunFactory(project=project, created_by=creator, status=RunStatus.FAILED)
    checkpoint(plain, 10)
    assert "did not run as a Job" in body(login(creator).get(tab(plain)))
    finished = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    checkpoint(finished.run, 10)
    html = body(login(creator).get(tab(finished.run)))
    assert "The run finished: use “Continue training from these weights”" in html
    assert "Resume from this checkpoint" not in html


def test_the_confirmation_says_the_sentence_and_defaults_to_the_source_version_and_queue(
    login, creator, failed_job, code_version, gpu
):
    CodeVersionFactory(code=code_version.code, version=2)
    ckpt = checkpoint(failed_job.run, 20)
    html = body(login(creator).get(reverse("jobs:checkpoint-resume", args=[ckpt.pk])))
    assert RESUME_SENTENCE.format(20) in html
    assert f'<option value="{code_version.pk}" selected>trainer v1</option>' in html and "trainer v2" in html
    assert 'value="cpu" selected' in html and 'value="gpu-a100"' in html
    assert "Resume in a new Run" in html


def test_resume_in_a_new_run_creates_the_job_and_opens_it(login, creator, failed_job, code_version, gpu,
                                                         celery_calls, django_capture_on_commit_callbacks):
    v2 = CodeVersionFactory(code=code_version.code, version=2)
    ckpt = checkpoint(failed_job.run, 20)
    with django_capture_on_commit_callbacks(execute=True):
        response = login(creator).post(
            reverse("jobs:checkpoint-resume", args=[ckpt.pk]), {"code_version": v2.pk, "queue": "gpu-a100"}
        )
    new = Job.objects.get(kind=JobKind.RESUME)
    assert response.status_code == 302 and response["Location"] == reverse("jobs:job-detail", args=[new.pk])
    assert new.code_version == v2 and new.queue == gpu and new.resumed_from == failed_job.run
    assert new.run.source_checkpoint == ckpt and new.run.parent == failed_job.run
    assert celery_calls.sent[-1]["queue"] == "gpu-a100"
    failed_job.run.refresh_from_db()
    assert failed_job.run.status == RunStatus.FAILED


def test_posting_the_confirmation_twice_creates_one_job(login, creator, failed_job):
    ckpt = checkpoint(failed_job.run, 20)
    client = login(creator)
    url = reverse("jobs:checkpoint-resume", args=[ckpt.pk])
    assert client.post(url, {"code_version": failed_job.code_version_id, "queue": "cpu"}).status_code == 302
    second = client.post(url, {"code_version": failed_job.code_version_id, "queue": "cpu"})
    new = Job.objects.get(kind=JobKind.RESUME)
    assert second.status_code == 409
    html = body(second)
    assert "A resume of this run is already queued or running:" in html
    assert f'<a href="{reverse("jobs:job-detail", args=[new.pk])}">Job {new.pk}</a>' in html
    assert Job.objects.filter(kind=JobKind.RESUME).count() == 1 and Run.objects.count() == 2


def test_a_member_who_is_not_the_creator_sees_the_reason_and_cannot_post(login, member, failed_job):
    ckpt = checkpoint(failed_job.run, 20)
    client = login(member)
    url = reverse("jobs:checkpoint-resume", args=[ckpt.pk])
    html = body(client.get(url))
    assert "This is not your run" in html and "Resume in a new Run" not in html
    assert client.post(url, {"queue": "cpu"}).status_code == 403
    assert not Job.objects.filter(kind=JobKind.RESUME).exists()


def test_a_pending_checkpoint_cannot_be_resumed_from(login, creator, failed_job):
    ckpt = checkpoint(failed_job.run, 20, state=CheckpointState.PENDING)
    client = login(creator)
    url = reverse("jobs:checkpoint-resume", args=[ckpt.pk])
    assert "This checkpoint is not complete" in body(client.get(url))
    response = client.post(url, {"queue": "cpu"})
    assert response.status_code == 409 and not Job.objects.filter(kind=JobKind.RESUME).exists()


def test_a_code_version_of_another_code_is_a_form_error(login, creator, failed_job, project):
    other = CodeVersionFactory(code__project=project, code__name="other")
    ckpt = checkpoint(failed_job.run, 20)
    response = login(creator).post(reverse("jobs:checkpoint-resume", args=[ckpt.pk]), {"code_version": other.pk})
    assert response.status_code == 400 and "Code version: Select a valid choice." in body(response)


# --- the Run page: logs, lineage, warning, ancestors' curves (F2, F16) ----------------------------------------------


def test_the_logs_tab_shows_the_log_and_polls_while_the_job_runs(login, viewer, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    services.job_append_log(job_id=job.pk, text="epoch 1\n")
    client = login(viewer)
    html = body(client.get(reverse("runs:run-logs", args=[job.run_id])))
    partial_url = reverse("jobs:run-log", args=[job.run_id])
    assert "epoch 1" in html and f'hx-get="{partial_url}"' in html
    services.job_append_log(job_id=job.pk, text="epoch 2\n")
    services.job_finish(job_id=job.pk, exit_code=0)
    partial = body(client.get(partial_url))
    assert "epoch 1\nepoch 2\n" in partial and "hx-get" not in partial and "<html" not in partial


def test_a_long_log_shows_its_end(login, viewer, creator, code_version, cpu, monkeypatch):
    from runs import selectors

    monkeypatch.setattr(selectors, "LOG_TAIL_CHUNKS", 3)
    monkeypatch.setattr(selectors.run_log_tail_last, "__kwdefaults__", {"max_chunks": 3})
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    for index in range(5):
        services.job_append_log(job_id=job.pk, text=f"line {index}\n")
    html = body(login(viewer).get(reverse("runs:run-logs", args=[job.run_id])))
    assert "line 2\nline 3\nline 4\n" in html and "line 1" not in html
    assert "2 earlier parts of the log are not shown" in html


def resumed_run(creator, failed_job, *, step=20):
    ckpt = checkpoint(failed_job.run, step)
    return services.run_resume_from_checkpoint(actor=creator, checkpoint=ckpt).run


def test_the_run_page_shows_lineage_with_the_source_checkpoint_children_and_job(login, viewer, creator, failed_job):
    child = resumed_run(creator, failed_job)
    client = login(viewer)
    html = body(client.get(reverse("runs:run-detail", args=[child.pk])))
    assert f'href="{reverse("runs:run-detail", args=[failed_job.run_id])}"' in html
    assert f'href="{reverse("checkpoints:checkpoint-detail", args=[child.source_checkpoint_id])}">step 20<' in html
    assert f'href="{reverse("jobs:job-detail", args=[child.job.pk])}"' in html and ">resumed<" in html
    parent_html = body(client.get(reverse("runs:run-detail", args=[failed_job.run_id])))
    assert f'href="{reverse("runs:run-detail", args=[child.pk])}"' in parent_html


def test_a_resumed_run_that_logs_below_its_checkpoint_gets_a_warning(login, viewer, creator, failed_job):
    child = resumed_run(creator, failed_job)
    url = reverse("runs:run-detail", args=[child.pk])
    metrics_ingest(actor=creator, run=child, points=[{"key": "loss", "value": 1.0, "step": 20}])
    assert "may have ignored the checkpoint" not in body(login(viewer).get(url))
    metrics_ingest(actor=creator, run=child, points=[{"key": "loss", "value": 2.0, "step": 0}])
    html = body(login(viewer).get(url))
    assert "the code may have ignored the checkpoint" in html and "first logged step is 0" in html


def test_the_ancestors_chart_includes_the_parents_points_up_to_the_resume_step(login, viewer, creator, failed_job):
    parent = failed_job.run
    metrics_ingest(actor=creator, run=parent, points=[
        {"key": "loss", "value": 3.0 - s / 10, "step": s} for s in range(27)
    ])
    child = resumed_run(creator, failed_job)
    metrics_ingest(actor=creator, run=child, points=[{"key": "loss", "value": 1.0 - s / 100, "step": s}
                                                    for s in range(20, 40)])
    client = login(viewer)
    plain = body(client.get(reverse("runs:run-detail", args=[child.pk])))
    assert "Show with ancestors" in plain and f'data-run="{parent.pk}"' not in plain
    html = body(client.get(reverse("runs:run-detail", args=[child.pk]) + "?ancestors=1"))
    ancestor = re.search(
        rf'<polyline class="series lineage-0 ancestor" data-run="{parent.pk}" data-points="(\d+)"', html
    )
    own = re.search(
        rf'<polyline class="series lineage-current" data-run="{child.pk}" data-points="(\d+)" points="([^"]+)"', html
    )
    assert ancestor and ancestor.group(1) == "20"  # steps 0..19: the child redid 20..26
    assert own and own.group(1) == "20"
    assert len(own.group(2).split()) == 21  # starts at the parent's last point: one joined line
    assert ">0<" in html and ">39<" in html  # the step axis spans both runs
    partial = body(client.get(reverse("runs:run-charts", args=[child.pk]) + "?ancestors=1"))
    assert f'data-run="{parent.pk}"' in partial


def test_a_run_without_a_parent_has_no_ancestors_toggle(login, viewer, failed_job, creator):
    metrics_ingest(actor=creator, run=failed_job.run, points=[{"key": "loss", "value": 1.0, "step": s} for s in (0, 1)])
    html = body(login(viewer).get(reverse("runs:run-detail", args=[failed_job.run_id]) + "?ancestors=1"))
    assert "Show with ancestors" not in html and 'class="series"' in html


def test_the_resume_pages_are_translated_into_japanese(login, creator, member, failed_job, settings):
    ckpt = checkpoint(failed_job.run, 20)
    client = login(creator)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    html = body(client.get(reverse("jobs:checkpoint-resume", args=[ckpt.pk])))
    assert "step 20のcheckpointから、新しいRunとして学習を再開します。" in html and "新しいRunで再開" in html
    html = body(client.get(tab(failed_job.run)))
    assert "このcheckpointから再開" in html
    html = body(client.get(jobs_url()))
    assert "最新checkpointから再開" in html and "ジョブを起動" in html and ">失敗<" in html
    other = login(member)
    other.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    assert "あなたが作成したRunではありません" in body(other.get(tab(failed_job.run)))
