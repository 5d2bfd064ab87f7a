"""Resume pages: "Resume from this checkpoint" and its confirmation, the Run page's logs, lineage and
ancestors chart, Japanese (docs/design/resume.md#steps-continue, #from-a-checkpoint, #lineage). Celery is never reached
(``celery_calls``).
"""

import pytest
from django.urls import reverse

from checkpoints.models import CheckpointState
from jobs import services
from jobs.models import Job, JobKind
from runs.metrics import metrics_ingest
from runs.models import Run, RunStatus
from tests.chart_helpers import chart_data
from tests.factories import CodeVersionFactory, RunFactory
from tests.jobs.conftest import body, checkpoint, launch, run_to_end

RESUME_SENTENCE = "Training will resume as a new Run from the checkpoint at step {}."


def jobs_url(slug="vision"):
    return reverse("jobs:project-jobs", args=[slug])


# --- "Resume from this checkpoint" (docs/design/resume.md#from-a-checkpoint) ------------------------------------------


def tab(run):
    return reverse("runs:run-checkpoints", args=[run.pk])


def test_the_checkpoint_tab_has_resume_for_the_creator(login, creator, failed_job):
    ckpt = checkpoint(failed_job.run, 20)
    html = body(login(creator).get(tab(failed_job.run)))
    assert f'href="{reverse("jobs:checkpoint-resume", args=[ckpt.pk])}"' in html
    assert "Resume from this checkpoint" in html


@pytest.mark.parametrize(
    "role, sentence",
    [
        ("viewer", "Your role in this project is viewer"),
        ("member", "This is not your run"),
    ],
)
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


def test_the_confirmation_says_the_sentence_and_defaults_to_the_newest_version_and_the_source_queue(
    login, creator, failed_job, code_version, gpu
):
    v2 = CodeVersionFactory(code=code_version.code, version=2)
    ckpt = checkpoint(failed_job.run, 20)
    html = body(login(creator).get(reverse("jobs:checkpoint-resume", args=[ckpt.pk])))
    assert RESUME_SENTENCE.format(20) in html
    # The version that just failed is rarely the one to run again: the newest is preselected.
    assert f'<option value="{v2.pk}" selected>trainer v2</option>' in html and "trainer v1" in html
    assert 'value="cpu" selected' in html and 'value="gpu-a100"' in html
    assert "Resume in a new Run" in html


def test_resume_from_latest_asks_first_on_the_latest_checkpoints_confirmation(login, creator, failed_job):
    checkpoint(failed_job.run, 10)
    latest = checkpoint(failed_job.run, 20)
    client = login(creator)
    job_page = body(client.get(reverse("jobs:job-detail", args=[failed_job.pk])))
    assert f'<a class="button primary" href="{reverse("jobs:job-resume-latest", args=[failed_job.pk])}">' in job_page
    response = client.get(reverse("jobs:job-resume-latest", args=[failed_job.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("jobs:checkpoint-resume", args=[latest.pk])
    assert Job.objects.count() == 1  # nothing launched by the click


def test_resume_in_a_new_run_creates_the_job_and_opens_it(
    login, creator, failed_job, code_version, gpu, celery_calls, django_capture_on_commit_callbacks
):
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


# --- the Run page: logs, lineage, warning, ancestors' curves (docs/design/resume.md#steps-continue) -------------------


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
    from jobs import selectors

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
    metrics_ingest(
        actor=creator, run=parent, points=[{"key": "loss", "value": 3.0 - s / 10, "step": s} for s in range(27)]
    )
    child = resumed_run(creator, failed_job)
    metrics_ingest(
        actor=creator, run=child, points=[{"key": "loss", "value": 1.0 - s / 100, "step": s} for s in range(20, 40)]
    )
    client = login(viewer)
    plain = body(client.get(reverse("runs:run-detail", args=[child.pk])))
    assert "Show with ancestors" in plain and f'data-run="{parent.pk}"' not in plain
    html = body(client.get(reverse("runs:run-detail", args=[child.pk]) + "?ancestors=1"))
    (chart,) = chart_data(html)["charts"]
    ancestor, own = chart["series"]
    assert ancestor["run"] == parent.pk and ancestor["dashed"]
    assert ancestor["x"] == list(range(20))  # steps 0..19: the child redid 20..26
    assert own["run"] == child.pk and own["x"] == list(range(20, 40)) and not own["dashed"]
    assert [(m["step"], m["kind"]) for m in chart["markers"]] == [(20, "resume")]
    partial = body(client.get(reverse("runs:run-charts", args=[child.pk]) + "?ancestors=1"))
    assert [s["run"] for s in chart_data(partial)["charts"][0]["series"]] == [parent.pk, child.pk]


def test_a_run_without_a_parent_has_no_ancestors_toggle(login, viewer, failed_job, creator):
    metrics_ingest(actor=creator, run=failed_job.run, points=[{"key": "loss", "value": 1.0, "step": s} for s in (0, 1)])
    html = body(login(viewer).get(reverse("runs:run-detail", args=[failed_job.run_id]) + "?ancestors=1"))
    assert "Show with ancestors" not in html and len(chart_data(html)["charts"][0]["series"]) == 1


def test_the_resume_pages_are_translated_into_japanese(login, creator, member, failed_job, settings):
    ckpt = checkpoint(failed_job.run, 20)
    client = login(creator)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    html = body(client.get(reverse("jobs:checkpoint-resume", args=[ckpt.pk])))
    assert "step 20のチェックポイントから、新しいRunとして学習を再開します。" in html and "新しいRunで再開" in html
    html = body(client.get(tab(failed_job.run)))
    assert "このチェックポイントから再開" in html
    html = body(client.get(jobs_url()))
    assert "最新チェックポイントから再開" in html and "ジョブを起動" in html and ">失敗<" in html
    other = login(member)
    other.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    assert "あなたが作成したRunではありません" in body(other.get(tab(failed_job.run)))
