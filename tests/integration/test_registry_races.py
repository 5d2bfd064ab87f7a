"""The model registry's aliases on a real PostgreSQL (docs/api.md#model-registry, #audit): two requests moving one
alias at the same instant both succeed, one after the other, and the audit log tells the same story."""

import pytest

from mado.models import AuditEvent
from mlflow_api.models import ModelAlias
from mlflow_api.registry import services
from tests.integration.concurrency import together
from tests.jobs.conftest import checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_alias_set_twice_at_once_ends_on_one_version_with_a_record_per_move(postgres, run, member, admin):
    one = services.checkpoint_register(actor=member, checkpoint=checkpoint(run, 10), name="resnet")
    two = services.checkpoint_register(actor=member, checkpoint=checkpoint(run, 20), name="resnet")
    model = one.registered_model
    for attempt in range(5):
        alias = f"prod-{attempt}"
        outcomes = together(
            (services.model_alias_set, {"actor": admin, "model": model, "alias": alias, "version": one}),
            (services.model_alias_set, {"actor": admin, "model": model, "alias": alias, "version": two}),
        )
        assert [error for _, error in outcomes] == [None, None]
        final = ModelAlias.objects.get(registered_model=model, alias=alias).version.version
        moves = [e.changes["version"] for e in AuditEvent.objects.filter(object_repr=f"resnet@{alias}").order_by("pk")]
        assert moves == [[None, 3 - final], [3 - final, final]]  # set by the first, moved by the second
