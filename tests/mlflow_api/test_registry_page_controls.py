"""The model page's controls (docs/api.md#model-registry): a Project admin sets, moves and removes aliases and
deletes versions there; members see no control and are refused; bad input is named and changes nothing."""

import pytest

from checkpoints.models import Checkpoint
from mlflow_api.models import ModelAlias, ModelVersion
from mlflow_api.registry import services
from tests.jobs.conftest import checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(run, member):
    """Model ``resnet`` with versions 1 and 2, each from a checkpoint of ``run``."""
    services.checkpoint_register(actor=member, checkpoint=checkpoint(run, 10), name="resnet")
    return services.checkpoint_register(actor=member, checkpoint=checkpoint(run, 20), name="resnet").registered_model


def aliases(model) -> dict[str, int]:
    return dict(ModelAlias.objects.filter(registered_model=model).values_list("alias", "version__version"))


def test_an_admin_sets_moves_and_removes_an_alias_on_the_model_page(login, admin, model):
    client = login(admin)
    page = client.get(f"/models/{model.pk}/").content.decode()
    assert 'class="filters set-alias"' in page and "Delete version 2 and its aliases" in page
    done = client.post(f"/models/{model.pk}/aliases/", {"alias": "champion", "version": "1"}, follow=True)
    assert "@champion now loads version 1." in done.content.decode() and aliases(model) == {"champion": 1}
    client.post(f"/models/{model.pk}/aliases/", {"alias": "champion", "version": "2"})
    assert aliases(model) == {"champion": 2}
    assert 'data-alias="champion"' in client.get(f"/models/{model.pk}/").content.decode()
    removed = client.post(f"/models/{model.pk}/aliases/champion/delete/", follow=True)
    assert "@champion was removed." in removed.content.decode() and aliases(model) == {}
    again = client.post(f"/models/{model.pk}/aliases/champion/delete/", follow=True)
    assert "not found" in again.content.decode()


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"alias": "latest", "version": "1"}, "neither &#x27;latest&#x27; nor &#x27;v&lt;number&gt;&#x27;"),
        ({"alias": "a/b", "version": "1"}, "alias must be 1 to 255 letters"),
        ({"alias": "ok", "version": "7"}, "Choose one of the model&#x27;s versions."),
        ({"alias": "ok", "version": "abc"}, "Choose one of the model&#x27;s versions."),
        ({"alias": "ok", "version": "9" * 40}, "Choose one of the model&#x27;s versions."),
    ],
)
def test_a_bad_alias_or_version_is_named_and_nothing_changes(login, admin, model, form, message):
    answer = login(admin).post(f"/models/{model.pk}/aliases/", form, follow=True)
    assert answer.status_code == 200 and message in answer.content.decode()
    assert aliases(model) == {}


def test_deleting_a_version_needs_the_confirmation_and_frees_its_checkpoint(login, admin, model):
    client = login(admin)
    unconfirmed = client.post(f"/models/{model.pk}/versions/1/delete/")
    assert unconfirmed.status_code == 400 and ModelVersion.objects.filter(registered_model=model).count() == 2
    assert client.post(f"/models/{model.pk}/versions/1/delete/", {"confirm": "1"}).status_code == 302
    assert list(ModelVersion.objects.filter(registered_model=model).values_list("version", flat=True)) == [2]
    assert Checkpoint.objects.get(step=10).registered_as == ""
    assert client.post(f"/models/{model.pk}/versions/1/delete/", {"confirm": "1"}).status_code == 404


def test_members_see_no_control_and_are_refused(login, member, model):
    client = login(member)
    page = client.get(f"/models/{model.pk}/").content.decode()
    assert "set-alias" not in page and "Delete version" not in page
    assert client.post(f"/models/{model.pk}/aliases/", {"alias": "champion", "version": "1"}).status_code == 403
    assert client.post(f"/models/{model.pk}/versions/1/delete/", {"confirm": "1"}).status_code == 403
    assert aliases(model) == {} and ModelVersion.objects.filter(registered_model=model).count() == 2
