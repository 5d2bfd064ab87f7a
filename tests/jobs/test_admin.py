"""Django admin: every jobs model is registered and its changelist and change page load
(docs/design/interfaces.md#surfaces)."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from jobs import services
from jobs.models import Queue
from tests.factories import UserFactory
from tests.jobs.conftest import launch

MODELS = list(apps.get_app_config("jobs").get_models())


@pytest.fixture
def superuser(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def one_of_each(creator, code_version, cpu):
    job = launch(creator, code_version, cpu)
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    services.job_append_log(job_id=job.pk, text="hello\n")
    services.run_token_issue(job=job)
    return job


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_is_registered(model):
    assert admin.site.is_registered(model)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelist_and_change_page_load_for_a_superuser(client, superuser, one_of_each, model):
    client.force_login(superuser)
    opts = model._meta
    changelist = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"), {"q": "a"})
    assert changelist.status_code == 200
    changelist = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert changelist.context["cl"].result_count >= 1
    obj = model.objects.first()
    assert client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])).status_code == 200


def test_the_token_key_is_never_shown_whole(client, superuser, one_of_each):
    from jobs.models import RunToken

    client.force_login(superuser)
    token = RunToken.objects.get()
    page = client.get(reverse("admin:jobs_runtoken_change", args=[token.pk])).content.decode()
    key = services.run_token_issue(job=one_of_each).key
    assert key not in page and token.prefix in page


def test_an_admin_adds_a_container_queue(client, superuser):
    client.force_login(superuser)
    response = client.post(
        reverse("admin:jobs_queue_add"),
        {
            "name": "gpu-a100",
            "description": "A100",
            "runner": "container",
            "image": "pytorch/pytorch:2",
            "enabled": "on",
        },
    )
    assert response.status_code == 302
    assert Queue.objects.get(name="gpu-a100").image == "pytorch/pytorch:2"
