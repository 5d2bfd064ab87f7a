"""Two processes starting one run id at once on a real PostgreSQL (docs/design/house.md#idempotent,
docs/design/runs.md#resume-modes, #one-writer-process).

Whatever the Run's state (absent, pending, stopped), exactly one start wins
and gets a fencing token; the other is refused (409) and the Run holds the
winner's writer. A write fenced by the loser's token never lands after a
takeover.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints.models import Checkpoint
from checkpoints.services import checkpoint_register
from mado.errors import Conflict, LeaseLost
from runs.metrics import metrics_ingest
from runs.models import MetricPoint, Run, RunStatus
from runs.resume import run_start
from tests.factories import RunFactory
from tests.integration.concurrency import together

pytestmark = pytest.mark.django_db(transaction=True)


def start(actor, project, host, resume="allow", **extra):
    return run_start, {
        "actor": actor,
        "project": project,
        "external_id": "exp-42",
        "resume": resume,
        "host": host,
        **extra,
    }


def one_winner(outcomes) -> Run:
    winners = [result for result, error in outcomes if error is None]
    losers = [error for result, error in outcomes if error is not None]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert isinstance(losers[0], Conflict), losers
    started = winners[0]
    stored = Run.objects.get(pk=started.run.pk)
    assert (stored.lease_token, stored.writer_host) == (started.run.lease_token, started.run.writer_host)
    return stored


@pytest.mark.parametrize("attempt", range(3))
def test_two_starts_of_an_absent_id_create_one_run(postgres, project, creator, attempt):
    # Two processes of one user (whoever creates the Run is its writer, docs/design/runs.md#write-rule; the other start
    # then resumes it).
    outcomes = together(start(creator, project, "a"), start(creator, project, "b"))
    run = one_winner(outcomes)
    assert Run.objects.filter(external_id="exp-42").count() == 1
    assert run.lease_token == 1
    loser = next(error for _, error in outcomes if error is not None)
    assert loser.code in ("run_live", "conflict")


@pytest.mark.parametrize("attempt", range(3))
def test_two_resumes_of_a_stopped_run_resume_it_once(postgres, project, creator, admin, attempt):
    run = RunFactory(
        project=project,
        created_by=creator,
        external_id="exp-42",
        status=RunStatus.CRASHED,
        started_at=timezone.now() - timedelta(hours=1),
        lease_token=4,
    )
    outcomes = together(start(creator, project, "a"), start(admin, project, "b"))
    stored = one_winner(outcomes)
    assert (stored.pk, stored.lease_token, stored.resume_count, stored.status) == (run.pk, 5, 1, RunStatus.RUNNING)
    loser = next(error for _, error in outcomes if error is not None)
    assert loser.code == "run_live"


@pytest.mark.parametrize("attempt", range(3))
def test_two_attaches_of_a_pending_run_start_it_once(postgres, project, creator, attempt):
    RunFactory(project=project, created_by=creator, external_id="exp-42", status=RunStatus.PENDING)
    stored = one_winner(together(start(creator, project, "a"), start(creator, project, "b")))
    assert (stored.status, stored.lease_token, stored.resume_count) == (RunStatus.RUNNING, 1, 0)


def test_a_batch_of_the_old_writer_racing_a_takeover_is_stored_before_it_or_refused(postgres, project, creator):
    # The old writer went silent (heartbeat past the crash timeout) but was not reaped yet: a new start takes the
    # Run over while the old writer's last batch is in flight. (A Run already ended crashed refuses every batch.)
    stale = timezone.now() - timedelta(hours=1)
    run = RunFactory(
        project=project,
        created_by=creator,
        external_id="exp-42",
        status=RunStatus.RUNNING,
        started_at=stale,
        heartbeat_at=stale,
        lease_token=1,
    )
    for round_ in range(5):
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, heartbeat_at=stale)
        old_token = Run.objects.get(pk=run.pk).lease_token
        points = [{"key": f"r{round_}", "value": 1.0, "step": 10_000 * (round_ + 1) + i} for i in range(2000)]
        outcomes = together(
            (
                metrics_ingest,
                {"actor": creator, "run": Run.objects.get(pk=run.pk), "points": points, "fencing_token": old_token},
            ),
            start(creator, project, f"new-{round_}"),
        )
        (ingested, ingest_error), (started, start_error) = outcomes
        assert start_error is None, start_error
        stored = MetricPoint.objects.filter(run=run, key=f"r{round_}").count()
        if ingest_error is None:
            assert stored == 2000, "committed before the takeover"
        else:
            assert isinstance(ingest_error, LeaseLost) and stored == 0


def test_two_processes_registering_one_step_after_a_takeover_leave_the_new_ones_checkpoint(postgres, project, creator):
    run = RunFactory(project=project, created_by=creator, external_id="exp-42", lease_token=2)
    Checkpoint.objects.create(run=run, step=100, lease_token=1)
    calls = [
        (checkpoint_register, {"actor": creator, "run": run, "step": 100, "fencing_token": token}) for token in (1, 2)
    ]
    (old, old_error), (new, new_error) = together(*calls)
    assert isinstance(old_error, LeaseLost) and new_error is None
    assert Checkpoint.objects.get(run=run, step=100).lease_token == 2
