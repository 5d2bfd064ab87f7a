"""Sign-on identities (docs/deploy.md#single-sign-on): the names a provider account claims become a free, valid
user name and never an existing one; an admin binds a subject by hand through the Django admin, audited."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.validators import UnicodeUsernameValidator

from mado.models import AuditEvent
from runs.identities import SignOnRefused, free_username, sign_on_user
from runs.models import ExternalIdentity, IdentityLink, Membership, Role
from runs.service_accounts import service_account_create
from tests.factories import ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db
ISSUER = "https://idp.example.com"


@pytest.mark.parametrize(
    "claims",
    [
        {"preferred_username": "../../etc/passwd"},
        {"preferred_username": "<script>alert(1)</script>"},
        {"preferred_username": "名前 with spaces\n\x00"},
        {"preferred_username": "x" * 400},
        {"preferred_username": "...---..."},
        {"preferred_username": ["not", "a", "string"]},
        {"email": "hostile name@example.com"},
        {},
    ],
    ids=["path", "markup", "unicode-control", "long", "punctuation", "list", "email", "nothing"],
)
def test_hostile_claimed_names_become_valid_free_user_names(claims):
    name = free_username(claims)
    UnicodeUsernameValidator()(name)
    assert 0 < len(name) <= 150 and "/" not in name and "<" not in name


def test_a_taken_name_is_never_reused_whatever_its_case():
    UserFactory(username="Root")
    UserFactory(username="root-2")
    assert free_username({"preferred_username": "root"}) == "root-3"


def test_a_name_in_a_service_accounts_form_is_not_handed_out_so_the_projects_admin_can_still_use_it():
    project = ProjectFactory(slug="vision")
    admin = UserFactory(username="alice")
    Membership.objects.create(user=admin, project=project, role=Role.ADMIN)
    squatter = sign_on_user(issuer=ISSUER, claims={"sub": "s-9", "preferred_username": "Vision.ci"})
    person = sign_on_user(issuer=ISSUER, claims={"sub": "s-10", "preferred_username": "john.doe"})
    account = service_account_create(actor=admin, project=project, name="ci")
    assert squatter.username == "Vision-ci" and person.username == "john.doe"
    assert account.user.username == "vision.ci"


def test_a_new_subject_gets_a_new_user_and_a_known_one_its_own():
    UserFactory(username="alice")
    first = sign_on_user(issuer=ISSUER, claims={"sub": "s-1", "preferred_username": "alice"})
    again = sign_on_user(issuer=ISSUER, claims={"sub": "s-1", "preferred_username": "bob"})
    other_issuer = sign_on_user(issuer="https://other.example.com", claims={"sub": "s-1", "preferred_username": "a"})
    assert first.username == "alice-2" and again == first and other_issuer not in (first,)


@pytest.mark.parametrize("subject", [None, "", "x" * 256, 42])
def test_an_unusable_subject_is_refused(subject):
    with pytest.raises(SignOnRefused, match="no usable subject"):
        sign_on_user(issuer=ISSUER, claims={"sub": subject, "preferred_username": "alice"})
    assert not get_user_model().objects.filter(username="alice").exists()


def test_an_admin_binds_a_subject_in_the_django_admin_and_a_duplicate_is_a_form_error(client):
    root = get_user_model().objects.create_superuser("root", password="pw")
    client.force_login(root)
    form = {"issuer": ISSUER, "subject": "s-9", "user": root.pk}
    assert client.post("/admin/runs/externalidentity/add/", form).status_code == 302
    identity = ExternalIdentity.objects.get()
    assert (identity.user, identity.linked_by) == (root, IdentityLink.ADMIN)
    assert AuditEvent.objects.get(action="identity.link").actor_name == "root"

    again = client.post("/admin/runs/externalidentity/add/", {**form, "user": UserFactory().pk})
    assert again.status_code == 200 and "already exists" in again.content.decode()
    assert ExternalIdentity.objects.get().user == root
    client.post(f"/admin/runs/externalidentity/{identity.pk}/delete/", {"post": "yes"})
    assert not ExternalIdentity.objects.exists() and AuditEvent.objects.filter(action="identity.unlink").count() == 1
