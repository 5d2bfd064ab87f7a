"""The crash reaper racing a heartbeat or a resume on a real PostgreSQL
(docs/design/runs.md#one-writer-process, #states).

Exactly one side wins each time: either the heartbeat (or resume) lands
first and the reaper spares the Run, or the reaper ends it first and the
heartbeat is refused (``RunEnded``) / the resume revives it. Never a
crashed Run whose heartbeat was accepted after it was judged, nor a Run the
reaper ends right after a resume took it over.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from mado.errors import RunEnded
from runs.liveness import run_heartbeat, runs_reap_crashed
from runs.models import Run, RunStatus
from runs.resume import run_start
from tests.integration.concurrency import together

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 6


@pytest.fixture
def stale_run(postgres, run, settings):
    """``run`` started by an SDK (fencing token 1) whose last heartbeat is past ``MMT_CRASH_TIMEOUT``."""
    settings.MMT_CRASH_TIMEOUT = 60

    def make_stale():
        old = timezone.now() - timedelta(seconds=120)
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.RUNNING,
            ended_at=None,
            started_at=old,
            heartbeat_at=old,
            lease_token=1,
        )
        run.refresh_from_db()
        return run

    return make_stale


def test_a_heartbeat_and_the_reaper_never_both_win(stale_run, creator):
    for _ in range(ROUNDS):
        run = stale_run()
        (reaped, reap_error), (beaten, beat_error) = together(
            (runs_reap_crashed, {}), (run_heartbeat, {"actor": creator, "run": run, "fencing_token": 1})
        )
        assert reap_error is None, reap_error
        stored = Run.objects.get(pk=run.pk)
        if reaped == 1:
            assert isinstance(beat_error, RunEnded), (beaten, beat_error)
            assert stored.status == RunStatus.CRASHED
        else:
            assert beat_error is None and reaped == 0, (reaped, beat_error)
            assert stored.status == RunStatus.RUNNING and stored.heartbeat_at > timezone.now() - timedelta(seconds=60)


def test_the_reaper_never_ends_a_run_a_resume_just_took_over(stale_run, creator, project):
    for _ in range(ROUNDS):
        run = stale_run()
        resumes = run.resume_count
        (reaped, reap_error), (started, start_error) = together(
            (runs_reap_crashed, {}),
            (
                run_start,
                {
                    "actor": creator,
                    "project": project,
                    "external_id": run.external_id,
                    "resume": "allow",
                    "host": "gpu-2",
                    "pid": 7,
                },
            ),
        )
        assert reap_error is None and start_error is None, (reap_error, start_error)
        stored = Run.objects.get(pk=run.pk)
        assert started.run.pk == run.pk and started.resumed
        assert stored.status == RunStatus.RUNNING and stored.ended_at is None
        assert stored.lease_token == 2 and stored.writer_host == "gpu-2" and stored.resume_count == resumes + 1
        assert reaped in (0, 1)
