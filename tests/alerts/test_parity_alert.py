"""A resumed Run whose parity verdict becomes ``diverged`` fires the parity rules once
(docs/design/alerts.md#rules; docs/design/resume.md#parity)."""

import pytest

from alerts.models import Event, Firing
from alerts.services.rules import rule_create
from tests.parity.conftest import child, curve, log, parent, source_checkpoint  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def test_a_diverged_resume_fires_the_parity_rule_once(log, parent, child, project, admin):  # noqa: F811
    rule_create(actor=admin, project=project, name="parity", event=Event.PARITY_DIVERGED, personal=False)
    log(parent, range(27))
    log(child, range(20, 25))
    assert not Firing.objects.exists()  # identical so far

    log(child, [25], value=lambda key, step: 9.0)
    log(child, [26], value=lambda key, step: 7.0)

    [firing] = Firing.objects.all()
    assert firing.run_id == child.pk and firing.title.endswith("diverged from its parent")
    assert "at step 25" in firing.text and str(curve("train.accuracy", 25)) in firing.text
