"""Concurrent sweep claims on a real PostgreSQL (docs/design/sweeps.md#sweeps, #requeue;
docs/design/house.md#idempotent).

Agents claiming at once never get one trial twice: new parameter sets are
numbered under the Sweep's row lock, queued trials are taken with
``SKIP LOCKED`` plus a conditional UPDATE, and requeued trials go first.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run, RunStatus
from sweeps.models import SweepTrial, TrialState
from sweeps.services import sweep_claim, sweep_create
from tests.integration.concurrency import together

pytestmark = pytest.mark.django_db(transaction=True)

AGENTS = 8


def claims_at_once(sweep, actors, now=None):
    outcomes = together(
        *[
            (sweep_claim, {"actor": actor, "sweep": sweep, "agent": f"agent:{i}", "now": now})
            for i, actor in enumerate(actors)
        ]
    )
    assert all(error is None for _, error in outcomes), outcomes
    return [claim for claim, _ in outcomes]


def config(method, **extra):
    parameters = {"lr": {"values": [0.1, 0.01, 0.001]}, "hidden": {"values": [32, 64]}}
    if method != "grid":
        parameters = {
            "lr": {"min": 0.0001, "max": 0.1, "distribution": "log_uniform_values"},
            "hidden": {"min": 8, "max": 64},
        }
    return {"method": method, "metric": {"name": "loss"}, "parameters": parameters, "program": "python t.py", **extra}


@pytest.mark.parametrize("method", ["grid", "random", "bayes"])
def test_agents_claiming_at_once_get_distinct_new_trials(postgres, project, member, admin, method):
    sweep = sweep_create(actor=member, project=project, config=config(method, run_cap=6))
    claims = claims_at_once(sweep, [member, admin] * (AGENTS // 2))
    trials = [claim.trial for claim in claims if claim.trial is not None]
    assert sorted(trial.number for trial in trials) == [1, 2, 3, 4, 5, 6]
    assert len({trial.run_id for trial in trials}) == 6
    assert all((claim.trial, claim.done) == (None, False) for claim in claims if claim.trial is None)
    assert SweepTrial.objects.filter(sweep=sweep).count() == Run.objects.filter(sweep_trial__sweep=sweep).count() == 6
    if method == "grid":
        assert len({tuple(sorted(trial.parameters.items())) for trial in trials}) == 6
    agents = dict(SweepTrial.objects.filter(sweep=sweep).values_list("number", "agent"))
    assert len(set(agents.values())) == 6


def test_requeued_trials_go_first_and_each_to_one_agent(postgres, project, member, admin):
    sweep = sweep_create(actor=member, project=project, config=config("random"))
    first = claims_at_once(sweep, [member] * 4)
    requeued = [claim.trial.pk for claim in first if claim.trial.number != 4]
    SweepTrial.objects.filter(pk__in=requeued).update(state=TrialState.QUEUED, agent="", lease_expires_at=None)
    Run.objects.filter(sweep_trial__pk__in=requeued).update(status=RunStatus.PREEMPTED)
    second = claims_at_once(sweep, [member, admin] * (AGENTS // 2))
    taken = [claim.trial.pk for claim in second if claim.trial.pk in requeued]
    assert sorted(taken) == sorted(requeued)
    assert sorted(claim.trial.number for claim in second) == [1, 2, 3, 5, 6, 7, 8, 9]


def test_an_expired_lease_goes_to_exactly_one_agent(postgres, project, member, admin, settings):
    settings.MMT_SWEEP_LEASE = 60
    sweep = sweep_create(actor=member, project=project, config=config("grid", run_cap=1))
    now = timezone.now()
    (lost,) = claims_at_once(sweep, [member], now=now)
    for round_ in range(1, 4):
        later = now + timedelta(seconds=61 * round_)
        claims = claims_at_once(sweep, [member, admin] * (AGENTS // 2), now=later)
        winners = [claim for claim in claims if claim.trial is not None]
        assert [claim.trial.pk for claim in winners] == [lost.trial.pk]
        trial = SweepTrial.objects.get(pk=lost.trial.pk)
        assert (trial.state, trial.agent, trial.lease_expires_at) == (
            TrialState.LEASED,
            winners[0].trial.agent,
            later + timedelta(seconds=60),
        )
