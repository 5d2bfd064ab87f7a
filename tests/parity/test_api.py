"""``parity`` and ``resume_ignored_at_step`` on the Run and Job resources, the Project's tolerance endpoint, and lists
that read the verdicts without a query per Run (docs/api.md "Resume parity"; docs/design/resume.md#parity)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints.models import Checkpoint
from jobs import services as job_services
from parity.services import restore_report_record
from tests.jobs.conftest import (  # noqa: F401
    celery_calls,
    checkpoint,
    code_version,
    cpu,
    dataset_versions,
    failed_job,
    launch,
)
from tests.parity.conftest import curve

pytestmark = pytest.mark.django_db


@pytest.fixture
def resumed_job(creator, failed_job):
    """``failed_job`` (logged steps 0..26, checkpoint at 20) resumed from its latest checkpoint as a Job."""
    checkpoint(failed_job.run, 20)
    return job_services.job_resume_from_latest(actor=creator, job=failed_job)


def test_a_resumed_jobs_run_starts_unknown_and_reads_identical_once_it_logged_the_overlap(
    api, creator, log, failed_job, resumed_job
):
    client = api(creator)
    waiting = client.get(f"/api/v1/jobs/{resumed_job.pk}/").json()
    assert waiting["parity"]["verdict"] == "unknown"
    assert (waiting["parity"]["checkpoint_step"], waiting["parity"]["parent_id"]) == (20, failed_job.run_id)
    assert (waiting["restore_report"], waiting["resume_ignored_at_step"]) == (None, None)
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 40))
    job = client.get(f"/api/v1/jobs/{resumed_job.pk}/").json()
    run = client.get(f"/api/v1/runs/{resumed_job.run_id}/").json()
    assert job["parity"] == run["parity"]
    parity = run["parity"]
    assert {k: parity[k] for k in ("verdict", "step", "key", "parent_value", "child_value")} == {
        "verdict": "identical",
        "step": None,
        "key": None,
        "parent_value": None,
        "child_value": None,
    }
    assert (parity["first_step"], parity["last_step"], parity["compared_steps"], parity["compared_points"]) == (
        20,
        26,
        7,
        14,
    )
    assert (parity["compared_keys"], parity["tolerance"], parity["max_difference"]) == (
        ["train.accuracy", "train.loss"],
        1e-6,
        0.0,
    )
    assert client.get(f"/api/v1/runs/{failed_job.run_id}/").json()["parity"] is None  # not started from a checkpoint


def test_a_divergence_to_nan_and_a_run_that_ignored_its_checkpoint_read_in_the_api(
    api, creator, log, failed_job, resumed_job
):
    log(failed_job.run, range(27))
    log(resumed_job.run, range(0, 30), value=lambda key, step: float("nan") if step >= 20 else curve(key, step))
    job = api(creator).get(f"/api/v1/jobs/{resumed_job.pk}/").json()
    assert job["resume_ignored_at_step"] == 0
    assert (job["parity"]["verdict"], job["parity"]["step"], job["parity"]["key"]) == ("diverged", 20, "train.accuracy")
    assert (job["parity"]["parent_value"], job["parity"]["child_value"]) == (curve("train.accuracy", 20), "NaN")
    assert job["parity"]["max_difference"] == "Infinity"


TRAINING_STATE = {"format": 1, "global_step": 20, "parts": {"model": {"sha256": "0" * 64, "file": "model.pt"}}}


@pytest.mark.parametrize("holds_state", [True, False])
def test_a_run_that_logs_without_reporting_a_restore_reads_ignored_when_its_checkpoint_holds_a_training_state(
    api, creator, log, failed_job, resumed_job, holds_state
):
    """The code continued at the checkpoint's step but never loaded it: only a checkpoint whose SDK would have
    reported the restore before the first metrics tells (docs/design/resume.md#checkpoint-not-loaded)."""
    metadata = {"training_state": TRAINING_STATE} if holds_state else {}
    Checkpoint.objects.filter(pk=resumed_job.run.source_checkpoint_id).update(metadata=metadata)
    client = api(creator)
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 30), value=lambda key, step: curve(key, step + 7))
    job = client.get(f"/api/v1/jobs/{resumed_job.pk}/").json()
    run = client.get(f"/api/v1/runs/{resumed_job.run_id}/").json()
    expected = 20 if holds_state else None
    assert (job["resume_ignored_at_step"], run["resume_ignored_at_step"]) == (expected, expected)
    assert (run["parity"]["verdict"], run["parity"]["step"]) == ("diverged", 20)
    restore_report_record(actor=creator, run=resumed_job.run, body={"parts": {"model": "restored"}})  # late: clears
    assert client.get(f"/api/v1/jobs/{resumed_job.pk}/").json()["resume_ignored_at_step"] is None


def test_a_restore_report_before_the_first_metrics_leaves_no_signal(api, creator, log, failed_job, resumed_job):
    Checkpoint.objects.filter(pk=resumed_job.run.source_checkpoint_id).update(
        metadata={"training_state": TRAINING_STATE}
    )
    restore_report_record(actor=creator, run=resumed_job.run, body={"parts": {"model": "restored"}})
    log(resumed_job.run, range(20, 30))
    assert api(creator).get(f"/api/v1/runs/{resumed_job.run_id}/").json()["resume_ignored_at_step"] is None


def test_lists_read_the_verdicts_without_a_query_per_run(api, creator, log, failed_job, resumed_job, cpu, code_version):
    for _ in range(3):
        other = launch(creator, code_version, cpu)
        job_services.job_claim(job_id=other.pk, worker_host="w")
    client = api(creator)
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 30))
    client.get("/api/v1/projects/")  # the token's first use records it (once a minute): not a query per run
    with CaptureQueriesContext(connection) as few:
        client.get("/api/v1/jobs/")
        client.get("/api/v1/runs/")
    for _ in range(5):
        job = launch(creator, code_version, cpu)
        job_services.job_claim(job_id=job.pk, worker_host="w")
    with CaptureQueriesContext(connection) as more:
        jobs = client.get("/api/v1/jobs/").json()["results"]
        client.get("/api/v1/runs/")
    assert len(more) == len(few)
    assert {job["id"]: (job["parity"] or {}).get("verdict") for job in jobs}[resumed_job.pk] == "identical"


@pytest.mark.parametrize(
    "body",
    [{"tolerance": -1e-9}, {"tolerance": 1.5}, {"tolerance": "1e-6"}, {"tolerance": True}, {"tolerance": None}, {}, []],
)
def test_a_bad_tolerance_is_refused_naming_it(api, admin, project, body):
    answer = api(admin).patch(f"/api/v1/projects/{project.slug}/parity/", body, format="json")
    assert (answer.status_code, answer.json()["field"]) == (400, "tolerance")
    assert api(admin).get(f"/api/v1/projects/{project.slug}/parity/").json() == {"tolerance": 1e-6}


def test_a_project_admin_sets_the_tolerance_and_members_read_it(api, admin, member, project):
    assert (
        api(member).patch(f"/api/v1/projects/{project.slug}/parity/", {"tolerance": 0.01}, format="json").status_code
        == 403
    )
    answer = api(admin).patch(f"/api/v1/projects/{project.slug}/parity/", {"tolerance": 0.01}, format="json")
    assert (answer.status_code, answer.json()) == (200, {"tolerance": 0.01})
    assert api(member).get(f"/api/v1/projects/{project.slug}/parity/").json() == {"tolerance": 0.01}
