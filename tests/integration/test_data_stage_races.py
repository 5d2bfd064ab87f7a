"""Two data stages recorded at once at one step on a real PostgreSQL (docs/design/house.md#idempotent,
docs/design/runs.md#data-stages-sdk).

Different sets: one wins, the other gets a 409 showing the winner's set. Identical content: both get the
same record. Either way one row exists.
"""

import pytest

from mado.errors import Conflict
from runs.models import DataStage
from runs.services import data_stage_record
from tests.factories import DatasetFactory, DatasetVersionFactory
from tests.integration.concurrency import together

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def versions(postgres, project, run):
    dataset = DatasetFactory(project=project, name="digits")
    made = [DatasetVersionFactory(dataset=dataset, version=f"v{i}") for i in range(3)]
    run.input_dataset_versions.set(made[:1])
    return made


def call(run, actor, ids):
    return data_stage_record, {"actor": actor, "run": run, "start_step": 15, "dataset_version_ids": ids}


@pytest.mark.parametrize("attempt", range(3))
def test_two_different_sets_at_one_step_one_wins_the_other_gets_409(run, creator, admin, versions, attempt):
    outcomes = together(
        call(run, creator, [versions[0].pk, versions[1].pk]), call(run, admin, [versions[0].pk, versions[2].pk])
    )
    winners = [result for result, error in outcomes if error is None]
    losers = [error for result, error in outcomes if error is not None]
    assert len(winners) == 1 and len(losers) == 1 and isinstance(losers[0], Conflict), outcomes
    stage, created = winners[0]
    assert created and DataStage.objects.count() == 1
    assert losers[0].extra["recorded"]["dataset_version_ids"] == sorted(v.pk for v in stage.dataset_versions.all())


def test_two_identical_records_at_once_give_one_record(run, creator, versions):
    ids = [versions[0].pk, versions[1].pk]
    outcomes = together(call(run, creator, ids), call(run, creator, ids))
    assert all(error is None for _, error in outcomes), outcomes
    assert {result[0].pk for result, _ in outcomes} == {DataStage.objects.get().pk}
    assert sorted(result[1] for result, _ in outcomes) == [False, True]
