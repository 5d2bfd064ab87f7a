"""One write rule for Runs (docs/design/runs.md#write-rule): the ways another member used to write to a Job's Run are
refused and change nothing; same-run resume by id follows the rule (with the Project opt-in); an ended Run takes no new
checkpoint on any API; the holder of a sweep trial writes to its Run."""

import pytest

from checkpoints.models import Checkpoint
from jobs.models import Job, JobStatus
from runs.models import Run, RunStatus
from sweeps.services import sweep_claim
from tests.jobs.conftest import checkpoint, launch, run_to_end
from tests.sweeps.sweep_helpers import make_sweep, start_program


def snapshot(run: Run) -> tuple:
    """What the bypasses used to change: the Run's status and lease, its Job's status, its checkpoints."""
    run.refresh_from_db()
    job = Job.objects.filter(run=run).first()
    return (
        run.status,
        run.lease_token,
        run.resume_count,
        job and job.status,
        sorted(Checkpoint.objects.filter(run=run).values_list("step", "state")),
    )


@pytest.fixture
def running_job(creator, code_version, cpu, project):
    """A Job of ``creator`` whose code started its Run (running, with a complete checkpoint at step 10)."""
    from jobs.services import job_claim
    from runs.resume import run_start

    job = launch(creator, code_version, cpu)
    job_claim(job_id=job.pk, worker_host="gpu-1")
    run_start(actor=creator, project=project, external_id=job.run.external_id, resume="allow")
    checkpoint(job.run, 10)
    return Job.objects.select_related("run").get(pk=job.pk)


@pytest.fixture
def failed_run(creator, code_version, cpu):
    job = run_to_end(launch(creator, code_version, cpu), exit_code=1)
    checkpoint(job.run, 10)
    return job.run


def test_another_member_cannot_abort_a_running_jobs_run_through_the_api(client_as, running_job):
    before = snapshot(running_job.run)
    response = client_as("member").patch(f"/api/v1/runs/{running_job.run_id}/", {"status": "aborted"}, format="json")
    assert response.status_code == 403 and "only its creator, its Job and project admins" in response.json()["detail"]
    assert snapshot(running_job.run) == before and before[0] == RunStatus.RUNNING


def test_another_member_cannot_kill_it_through_mlflow(client_as, running_job):
    before = snapshot(running_job.run)
    response = client_as("member").post(
        "/api/2.0/mlflow/runs/update", {"run_id": running_job.run.external_id, "status": "KILLED"}, format="json"
    )
    assert (response.status_code, response.json()["error_code"]) == (403, "PERMISSION_DENIED")
    assert snapshot(running_job.run) == before


def test_another_member_cannot_reopen_a_failed_jobs_run_by_id_and_its_creator_can_still_resume_it(
    client_as, failed_run, project
):
    before = snapshot(failed_run)
    body = {"project": project.slug, "external_id": failed_run.external_id, "resume": "allow"}
    response = client_as("member").post("/api/v1/runs/", body, format="json")
    assert response.status_code == 403 and response.json()["field"] == "external_id"
    assert snapshot(failed_run) == before and before[0] == RunStatus.FAILED
    job = Job.objects.get(run=failed_run)
    resumed = client_as("creator").post(f"/api/v1/jobs/{job.pk}/resume-latest/", {}, format="json")
    assert resumed.status_code == 201, resumed.content


def test_no_checkpoint_is_planted_on_another_members_failed_run(client_as, failed_run):
    before = snapshot(failed_run)
    response = client_as("member").post(f"/api/v1/runs/{failed_run.pk}/checkpoints/", {"step": 99}, format="json")
    assert response.status_code == 403
    assert snapshot(failed_run) == before


def test_an_ended_run_takes_no_new_checkpoint_on_either_api_even_from_its_creator(client_as, api, failed_run, project):
    before = snapshot(failed_run)
    native = client_as("creator").post(f"/api/v1/runs/{failed_run.pk}/checkpoints/", {"step": 99}, format="json")
    assert (native.status_code, native.json()["error"]) == (409, "run_ended")
    assert "resume it before saving checkpoints" in native.json()["detail"]
    mlflow = client_as("creator").put(
        f"/api/2.0/mlflow-artifacts/artifacts/{project.pk}/{failed_run.external_id}/artifacts/checkpoints/step-99/w.pt",
        b"weights",
        content_type="application/octet-stream",
    )
    assert mlflow.status_code == 409 and "has ended" in mlflow.json()["message"]
    assert snapshot(failed_run) == before


def test_a_resume_by_id_reopens_the_run_for_new_checkpoints(client_as, project, creator):
    run = Run.objects.create(project=project, created_by=creator, external_id="sdk-run", status=RunStatus.CRASHED)
    body = {"project": project.slug, "external_id": "sdk-run", "resume": "must"}
    assert client_as("creator").post("/api/v1/runs/", body, format="json").status_code == 200
    assert (
        client_as("creator").post(f"/api/v1/runs/{run.pk}/checkpoints/", {"step": 5}, format="json").status_code == 201
    )


@pytest.mark.parametrize(
    "opted_in, ran_as_job, expected",
    [
        (False, False, 403),
        (True, False, 200),
        (True, True, 403),
    ],
)
def test_other_members_resume_by_id_only_runs_without_a_job_of_an_opted_in_project(
    client_as, project, creator, failed_run, opted_in, ran_as_job, expected
):
    project.members_may_resume = opted_in
    project.save()
    run = (
        failed_run
        if ran_as_job
        else Run.objects.create(project=project, created_by=creator, external_id="sdk-run", status=RunStatus.CRASHED)
    )
    body = {"project": project.slug, "external_id": run.external_id, "resume": "allow"}
    response = client_as("member").post("/api/v1/runs/", body, format="json")
    assert response.status_code == expected, response.content
    run.refresh_from_db()
    assert (run.status == RunStatus.RUNNING) == (expected == 200)
    assert client_as("viewer").post("/api/v1/runs/", body, format="json").status_code == 403


def test_the_member_whose_agent_holds_a_trial_writes_to_its_run_and_loses_it_with_the_claim(
    client_as, project, creator, member, admin
):
    sweep = make_sweep(actor=creator, project=project)
    trial = sweep_claim(actor=creator, sweep=sweep, agent="a:1").trial
    run = start_program(actor=creator, trial=trial)
    from runs.services import run_set_status

    run_set_status(actor=creator, run=run, status=RunStatus.PREEMPTED)  # back to the queue
    trial = sweep_claim(actor=member, sweep=sweep, agent="b:2").trial
    assert trial.run_id == run.pk
    body = {"project": project.slug, "external_id": run.external_id, "resume": "allow"}
    assert client_as("member").post("/api/v1/runs/", body, format="json").status_code == 200
    points = {"points": [{"key": "loss", "value": 0.1, "step": 1}]}
    assert client_as("member").post(f"/api/v1/runs/{run.pk}/metrics/", points, format="json").status_code == 201
    run_set_status(actor=admin, run=run, status=RunStatus.FINISHED)  # the trial is done: the claim no longer holds
    assert client_as("member").post(f"/api/v1/runs/{run.pk}/metrics/", points, format="json").status_code == 403
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 0
