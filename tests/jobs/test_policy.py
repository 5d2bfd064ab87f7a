"""The sentence shown in place of the resume button (docs/design/resume.md#who-may-resume, #latest-checkpoint;
mado.policy.why_cannot_resume via jobs.selectors.resume_refusal)."""

import pytest

from jobs import services
from jobs.selectors import resume_refusal
from mado import policy
from runs.models import RunStatus
from tests.factories import RunFactory
from tests.jobs.conftest import checkpoint, launch, run_to_end


@pytest.mark.parametrize(
    "role, reason",
    [
        ("creator", None),
        ("admin", None),
        ("member", "This is not your run"),
        ("viewer", "Your role in this project is viewer"),
        ("outsider", "You are not a member of this project"),
    ],
)
def test_who_may_resume(request, failed_job, role, reason):
    checkpoint(failed_job.run, 10)
    answer = resume_refusal(user=request.getfixturevalue(role), run=failed_job.run)
    assert answer == reason if reason is None else answer.startswith(reason)
    assert (policy.why_cannot_manage_job(request.getfixturevalue(role), failed_job.run) is None) == (reason is None)


def test_the_state_reasons(creator, code_version, cpu, project):
    queued = launch(creator, code_version, cpu)
    assert "Job has not started yet" in resume_refusal(user=creator, run=queued.run)
    running = services.job_claim(job_id=launch(creator, code_version, cpu).pk, worker_host="gpu-1")
    assert "still running" in resume_refusal(user=creator, run=running.run)
    finished = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    assert "finished: use “Continue training" in resume_refusal(user=creator, run=finished.run)
    failed = run_to_end(launch(creator, code_version, cpu), exit_code=1)
    assert resume_refusal(user=creator, run=failed.run) == "The run has no complete checkpoint to resume from."
    assert resume_refusal(user=creator, run=failed.run, need_checkpoint=False) is None
    plain = RunFactory(project=project, created_by=creator, status=RunStatus.FAILED)
    assert "did not run as a Job" in resume_refusal(user=creator, run=plain)


def test_a_permission_reason_comes_before_a_state_reason(member, creator, code_version, cpu):
    running = launch(creator, code_version, cpu)
    assert resume_refusal(user=member, run=running.run).startswith("This is not your run")
