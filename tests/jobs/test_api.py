"""API: jobs/, jobs/{id}/, abort, resume-latest, logs, checkpoints/{id}/resume/, queues/ (docs/api.md "Jobs")."""

import pytest

from jobs import services
from jobs.models import Job, JobKind, JobStatus
from runs.models import RunStatus
from tests.factories import CodeVersionFactory
from tests.jobs.conftest import checkpoint, launch, run_to_end

READ = [("admin", 200), ("member", 200), ("creator", 200), ("viewer", 200), ("outsider", 404), ("anonymous", 401)]
MANAGE = [("creator", 201), ("admin", 201), ("member", 403), ("viewer", 403), ("outsider", 404), ("anonymous", 401)]


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 201),
        ("member", 201),
        ("creator", 201),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_launch_permission_matrix(client_as, code_version, cpu, role, status):
    response = client_as(role).post("/api/v1/jobs/", {"code_version_id": code_version.pk, "name": "lr"}, format="json")
    assert response.status_code == status, response.content
    assert Job.objects.exists() == (status == 201)


def test_launch_records_its_inputs_and_answers_the_job(client_as, code_version, gpu, dataset_versions, member):
    body = {
        "code_version_id": code_version.pk,
        "queue": "gpu-a100",
        "parameters": {"lr": 0.01},
        "name": "lr-0.01",
        "input_dataset_version_ids": [dataset_versions[1].pk],
        "kind": "fine_tuning",
        "max_retries": 2,
    }
    response = client_as("member").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["queue"], data["kind"], data["status"], data["max_retries"], data["attempt"]) == (
        "gpu-a100",
        "new",
        "queued",
        2,
        1,
    )
    assert (data["project"], data["run_kind"], data["run_status"], data["created_by"]) == (
        "vision",
        "fine_tuning",
        "pending",
        "mike-member",
    )
    assert data["resume_refusal"] and "Job has not started yet" in data["resume_refusal"]
    job = Job.objects.get(pk=data["id"])
    assert job.run.parameters == {"lr": 0.01} and list(job.run.input_dataset_versions.all()) == [dataset_versions[1]]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"queue": "nowhere"}, "queue"),
        ({"max_retries": 11}, "max_retries"),
        ({"parameters": [1]}, "parameters"),
        ({"kind": "magic"}, "kind"),
    ],
)
def test_launch_names_the_bad_field(client_as, code_version, cpu, body, field):
    response = client_as("member").post("/api/v1/jobs/", {"code_version_id": code_version.pk, **body}, format="json")
    assert response.status_code == 400 and response.json()["field"] == field


def test_launch_with_a_code_version_of_another_project_answers_404(client_as, cpu, other_project, member):
    foreign = CodeVersionFactory(code__project=other_project)
    response = client_as("member").post("/api/v1/jobs/", {"code_version_id": foreign.pk}, format="json")
    assert response.status_code == 404 and response.json()["field"] == "code_version_id"


@pytest.mark.parametrize("role, status", READ)
def test_job_detail_permission_matrix(client_as, failed_job, role, status):
    response = client_as(role).get(f"/api/v1/jobs/{failed_job.pk}/")
    assert response.status_code == status
    if status == 200:
        data = response.json()
        assert (data["id"], data["status"], data["run_status"], data["error"]) == (
            failed_job.pk,
            "failed",
            "failed",
            "The code exited with code 1.",
        )


def test_job_detail_says_why_the_user_cannot_resume(client_as, failed_job):
    checkpoint(failed_job.run, 10)
    assert client_as("creator").get(f"/api/v1/jobs/{failed_job.pk}/").json()["resume_refusal"] is None
    assert (
        client_as("member")
        .get(f"/api/v1/jobs/{failed_job.pk}/")
        .json()["resume_refusal"]
        .startswith("This is not your run")
    )


@pytest.mark.parametrize(
    "role, visible",
    [
        ("admin", True),
        ("member", True),
        ("creator", True),
        ("viewer", True),
        ("outsider", False),
    ],
)
def test_job_list_shows_only_jobs_of_the_users_projects(client_as, failed_job, role, visible):
    response = client_as(role).get("/api/v1/jobs/")
    assert [job["id"] for job in response.json()["results"]] == ([failed_job.pk] if visible else [])


def test_job_list_filters(client_as, failed_job, creator, code_version, cpu):
    queued = launch(creator, code_version, cpu)
    client = client_as("viewer")
    assert [j["id"] for j in client.get("/api/v1/jobs/?project=vision&status=queued").json()["results"]] == [queued.pk]
    assert client.get("/api/v1/jobs/?project=other").status_code == 404
    assert client.get("/api/v1/jobs/?status=sleeping").json()["field"] == "status"
    assert client_as("anonymous").get("/api/v1/jobs/").status_code == 401


@pytest.mark.parametrize("role, status", MANAGE)
def test_resume_from_checkpoint_permission_matrix(client_as, failed_job, role, status):
    ckpt = checkpoint(failed_job.run, 20)
    response = client_as(role).post(f"/api/v1/checkpoints/{ckpt.pk}/resume/", {}, format="json")
    assert response.status_code == status, response.content
    assert Job.objects.filter(kind=JobKind.RESUME).exists() == (status == 201)
    if status == 201:
        data = response.json()
        assert (data["kind"], data["resumed"], data["resumed_from_run_id"]) == ("resume", True, failed_job.run_id)
        assert (data["source_checkpoint_id"], data["source_checkpoint_step"]) == (ckpt.pk, 20)


@pytest.mark.parametrize("role, status", MANAGE)
def test_resume_latest_permission_matrix(client_as, failed_job, role, status):
    checkpoint(failed_job.run, 10)
    latest = checkpoint(failed_job.run, 20)
    response = client_as(role).post(f"/api/v1/jobs/{failed_job.pk}/resume-latest/", format="json")
    assert response.status_code == status, response.content
    if status == 201:
        assert response.json()["source_checkpoint_id"] == latest.pk


def test_resume_refusals_answer_409_with_the_reason(client_as, failed_job, creator, code_version, cpu):
    client = client_as("creator")
    response = client.post(f"/api/v1/jobs/{failed_job.pk}/resume-latest/", format="json")
    assert (
        response.status_code == 409
        and response.json()["detail"] == "The run has no complete checkpoint to resume from."
    )
    finished = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    response = client.post(f"/api/v1/checkpoints/{checkpoint(finished.run, 5).pk}/resume/", format="json")
    assert response.status_code == 409 and "Continue training" in response.json()["detail"]
    ckpt = checkpoint(failed_job.run, 20)
    first = client.post(f"/api/v1/checkpoints/{ckpt.pk}/resume/", format="json")
    second = client.post(f"/api/v1/checkpoints/{ckpt.pk}/resume/", format="json")
    assert first.status_code == 201 and second.status_code == 409
    assert second.json()["job_id"] == first.json()["id"]
    assert Job.objects.filter(resumed_from=failed_job.run).count() == 1


def test_resume_accepts_a_code_version_and_queue(client_as, failed_job, code_version, gpu):
    newer = CodeVersionFactory(code=code_version.code, version=2)
    ckpt = checkpoint(failed_job.run, 20)
    response = client_as("creator").post(
        f"/api/v1/checkpoints/{ckpt.pk}/resume/", {"code_version_id": newer.pk, "queue": "gpu-a100"}, format="json"
    )
    assert response.status_code == 201
    assert (response.json()["code_version_id"], response.json()["queue"]) == (newer.pk, "gpu-a100")


def test_resume_of_another_projects_checkpoint_answers_404(client_as, failed_job, outsider):
    ckpt = checkpoint(failed_job.run, 20)
    assert client_as("outsider").post(f"/api/v1/checkpoints/{ckpt.pk}/resume/", format="json").status_code == 404


@pytest.mark.parametrize(
    "role, status",
    [
        ("creator", 200),
        ("admin", 200),
        ("member", 403),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_abort_permission_matrix(client_as, creator, code_version, cpu, role, status):
    job = launch(creator, code_version, cpu)
    response = client_as(role).post(f"/api/v1/jobs/{job.pk}/abort/", format="json")
    assert response.status_code == status, response.content
    job.refresh_from_db()
    assert (job.status == JobStatus.ABORTED) == (status == 200)
    if status == 200:
        assert response.json()["run_status"] == RunStatus.ABORTED


def test_abort_of_an_ended_job_answers_409(client_as, failed_job):
    response = client_as("creator").post(f"/api/v1/jobs/{failed_job.pk}/abort/", format="json")
    assert response.status_code == 409 and "already ended failed" in response.json()["detail"]


@pytest.mark.parametrize("role, status", READ)
def test_logs_permission_matrix(client_as, failed_job, role, status):
    assert client_as(role).get(f"/api/v1/jobs/{failed_job.pk}/logs/").status_code == status


def test_logs_tail_with_after_seq(client_as, creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="w")
    for line in ("a\n", "b\n", "c\n"):
        services.job_append_log(job_id=job.pk, text=line)
    client = client_as("viewer")
    data = client.get(f"/api/v1/jobs/{job.pk}/logs/?after_seq=1").json()
    assert [(c["seq"], c["text"]) for c in data["results"]] == [(2, "b\n"), (3, "c\n")]
    assert (data["next_after_seq"], data["job_status"], data["finished"], data["truncated"]) == (
        3,
        "running",
        False,
        False,
    )
    services.job_finish(job_id=job.pk, exit_code=0)
    data = client.get(f"/api/v1/jobs/{job.pk}/logs/?after_seq=3").json()
    assert (data["results"], data["next_after_seq"], data["finished"]) == ([], 3, True)
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/?after_seq=-1").json()["field"] == "after_seq"


def test_queues_lists_enabled_queues(client_as, cpu, gpu):
    gpu.enabled = False
    gpu.save()
    response = client_as("viewer").get("/api/v1/queues/")
    assert [q["name"] for q in response.json()["results"]] == ["cpu"]
    assert client_as("anonymous").get("/api/v1/queues/").status_code == 401


def test_launch_is_dispatched_on_commit(client_as, code_version, gpu, celery_calls, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as("creator").post(
            "/api/v1/jobs/", {"code_version_id": code_version.pk, "queue": "gpu-a100"}, format="json"
        )
    job = Job.objects.get(pk=response.json()["id"])
    assert celery_calls.sent == [
        {"name": "worker.tasks.run_job", "args": [job.pk], "queue": "gpu-a100", "task_id": job.celery_task_id}
    ]
