"""Django admin of the parity app (docs/design/interfaces.md#surfaces): every model is registered and its pages load;
an operator sets a Project's tolerance there and the Project's verdicts are compared again with it
(docs/design/resume.md#parity)."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from parity.models import Parity, ParitySettings
from parity.services import restore_report_record
from tests.factories import UserFactory
from tests.parity.conftest import curve

pytestmark = pytest.mark.django_db
MODELS = list(apps.get_app_config("parity").get_models())


@pytest.fixture
def superuser(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def diverged(log, parent, child, creator):
    log(parent, range(27))
    log(child, range(20, 30), value=lambda key, step: curve(key, step) * (1 + 1e-4))
    restore_report_record(actor=creator, run=child, body={"parts": {"model": "restored"}})
    return Parity.objects.get(run=child)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_is_registered_and_its_pages_load(client, superuser, diverged, project, model):
    ParitySettings.objects.create(project=project, tolerance=1e-6)
    assert admin.site.is_registered(model)
    client.force_login(superuser)
    opts = model._meta
    assert client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")).status_code == 200
    row = model.objects.first()
    assert client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[row.pk])).status_code == 200


def test_an_operator_sets_the_tolerance_and_the_verdicts_follow(client, superuser, diverged, project):
    assert diverged.verdict == "diverged"
    client.force_login(superuser)
    add = reverse("admin:parity_paritysettings_add")
    refused = client.post(add, {"project": project.pk, "tolerance": "2"})
    assert refused.status_code == 200 and not ParitySettings.objects.exists()
    saved = client.post(add, {"project": project.pk, "tolerance": "0.001"})
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    diverged.refresh_from_db()
    assert (ParitySettings.objects.get().tolerance, diverged.verdict, diverged.tolerance) == (
        1e-3,
        "within_tolerance",
        1e-3,
    )
