"""The sentence shown in place of the resume button (SPEC F6, F8; mado.policy.why_cannot_resume)."""

import pytest

from mado import policy
from runs.models import RunStatus
from tests.factories import RunFactory
from tests.jobs.conftest import checkpoint, launch, run_to_end


@pytest.mark.parametrize("role, reason", [
    ("creator", None),
    ("admin", None),
    ("member", "This is not your run"),
    ("viewer", "Your role in this project is viewer"),
    ("outsider", "You are not a member of this project"),
])
def test_who_may_resume(request, failed_job, role, reason):
    checkpoint(failed_job.run, 10)
    answer = policy.why_cannot_resume(request.getfixturevalue(role), failed_job.run)
    assert answer == reason if reason is None else answer.startswith(reason)
    assert policy.can_manage_job(request.getfixturevalue(role), failed_job.run) == (reason is None)


def test_the_state_reasons(creator, code_version, cpu, project):
    running = launch(creator, code_version, cpu)
    assert "still running" in policy.why_cannot_resume(creator, running.run)
    finished = run_to_end(launch(creator, code_version, cpu), exit_code=0)
    assert "finished: use “Continue training" in policy.why_cannot_resume(creator, finished.run)
    failed = run_to_end(launch(creator, code_version, cpu), exit_code=1)
    assert policy.why_cannot_resume(creator, failed.run) == "The run has no complete checkpoint to resume from."
    assert policy.why_cannot_resume(creator, failed.run, need_checkpoint=False) is None
    plain = RunFactory(project=project, created_by=creator, status=RunStatus.FAILED)
    assert "did not run as a Job" in policy.why_cannot_resume(creator, plain)


def test_a_permission_reason_comes_before_a_state_reason(member, creator, code_version, cpu):
    running = launch(creator, code_version, cpu)
    assert policy.why_cannot_resume(member, running.run).startswith("This is not your run")
