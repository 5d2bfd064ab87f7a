"""Races on a real PostgreSQL around the model registry (docs/design/checkpoints.md#deletion;
docs/design/house.md#idempotent).

Registering a checkpoint as a model version and deleting that checkpoint at
the same moment never both win; two registrations of one checkpoint into one
model at once (a double click) make one version.
"""

import pytest

from checkpoints import services as checkpoint_services
from checkpoints.models import Checkpoint, CheckpointState
from mlflow_api.models import ModelVersion
from mlflow_api.registry import services
from tests.integration.concurrency import together

pytestmark = pytest.mark.django_db(transaction=True)


def complete_checkpoint(run, step) -> Checkpoint:
    return Checkpoint.objects.create(run=run, step=step, state=CheckpointState.COMPLETE)


def test_registering_and_deleting_a_checkpoint_at_once_never_both_win(postgres, run, member, admin, settings):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    complete_checkpoint(run, 100)  # the kept one: steps 1..6 may be deleted
    for step in range(1, 7):
        target = complete_checkpoint(run, step)
        (version, register_error), (_, delete_error) = together(
            (services.checkpoint_register, {"actor": member, "checkpoint": target, "name": f"net-{step}"}),
            (checkpoint_services.checkpoint_delete, {"actor": admin, "checkpoint": target}),
        )
        target.refresh_from_db()
        assert (register_error is None) != (delete_error is None), (register_error, delete_error)
        if register_error is None:
            assert target.state == CheckpointState.COMPLETE and target.registered_as == f"net-{step} v1"
            assert "registered as model version" in delete_error.detail
        else:
            assert target.state == CheckpointState.DELETED and target.registered_as == ""
            assert "not complete" in register_error.detail
            assert not ModelVersion.objects.filter(checkpoint=target).exists()


def test_a_double_registration_makes_one_version(postgres, run, member):
    for step in range(1, 5):
        target = complete_checkpoint(run, step)
        outcomes = together(
            (services.checkpoint_register, {"actor": member, "checkpoint": target, "name": "twice"}),
            (services.checkpoint_register, {"actor": member, "checkpoint": target, "name": "twice"}),
        )
        assert [error for _, error in outcomes] == [None, None]
        assert outcomes[0][0].pk == outcomes[1][0].pk
        assert ModelVersion.objects.filter(checkpoint=target).count() == 1
