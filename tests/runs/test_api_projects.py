"""API: projects/ and projects/{slug}/members/ (docs/api.md)."""

import pytest

from runs.models import Membership, Project, Role
from tests.factories import UserFactory

# --- projects ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "role, expected",
    [
        ("admin", "admin"),
        ("member", "member"),
        ("creator", "member"),
        ("viewer", "viewer"),
    ],
)
def test_project_list_shows_the_callers_role(client_as, project, role, expected):
    response = client_as(role).get("/api/v1/projects/")
    assert response.status_code == 200
    assert [(p["slug"], p["role"]) for p in response.json()["results"]] == [("vision", expected)]
    assert set(response.json()["results"][0]) == {"id", "name", "slug", "role", "created_at"}


def test_project_list_hides_projects_the_user_is_not_in(client_as, project):
    slugs = [p["slug"] for p in client_as("outsider").get("/api/v1/projects/").json()["results"]]
    assert slugs == ["other"]


def test_project_list_refuses_anonymous(client_as, project):
    assert client_as("anonymous").get("/api/v1/projects/").status_code == 401


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("member", 200),
        ("creator", 200),
        ("viewer", 200),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_project_detail_permission_matrix(client_as, project, role, status):
    response = client_as(role).get("/api/v1/projects/vision/")
    assert response.status_code == status
    if status == 200:
        assert response.json()["slug"] == "vision"


def test_creating_a_project_makes_the_creator_its_admin(client_as, outsider):
    response = client_as("outsider").post("/api/v1/projects/", {"name": "Speech Models"}, format="json")
    assert response.status_code == 201
    assert response.json()["slug"] == "speech-models" and response.json()["role"] == "admin"
    assert Membership.objects.get(project__slug="speech-models").user == outsider


def test_creating_a_project_with_a_taken_slug_is_a_conflict(client_as, project, outsider):
    response = client_as("outsider").post("/api/v1/projects/", {"name": "Mine", "slug": "vision"}, format="json")
    assert response.status_code == 409
    assert response.json() == {"error": "conflict", "detail": response.json()["detail"], "field": "slug"}
    assert Project.objects.get(slug="vision").name == "Vision"


def test_creating_a_project_without_a_name_names_the_field(client_as, outsider):
    response = client_as("outsider").post("/api/v1/projects/", {"slug": "x"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid" and response.json()["field"] == "name"


def test_a_slug_derived_from_a_long_name_is_cut_to_fit(client_as, outsider):
    response = client_as("outsider").post("/api/v1/projects/", {"name": "word " * 40}, format="json")
    assert response.status_code == 201 and len(response.json()["slug"]) <= 100
    assert not response.json()["slug"].endswith("-")


def test_anonymous_cannot_create_a_project(client_as, db):
    assert client_as("anonymous").post("/api/v1/projects/", {"name": "X"}, format="json").status_code == 401
    assert not Project.objects.exists()


# --- members ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("member", 200),
        ("creator", 200),
        ("viewer", 200),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_member_list_permission_matrix(client_as, admin, member, viewer, role, status):
    response = client_as(role).get("/api/v1/projects/vision/members/")
    assert response.status_code == status
    if status == 200:
        rows = response.json()["results"]
        assert {(r["username"], r["role"]) for r in rows} >= {("alice-admin", "admin"), ("vera-viewer", "viewer")}
        assert set(rows[0]) == {"username", "role", "created_at"}


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 201),
        ("member", 403),
        ("creator", 403),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_adding_a_member_is_for_admins_only(client_as, project, admin, role, status):
    UserFactory(username="newbie")
    response = client_as(role).post(
        "/api/v1/projects/vision/members/", {"username": "newbie", "role": "viewer"}, format="json"
    )
    assert response.status_code == status
    assert project.memberships.filter(user__username="newbie").exists() == (status == 201)


def test_adding_an_unknown_user_names_username(client_as, admin):
    response = client_as("admin").post(
        "/api/v1/projects/vision/members/", {"username": "ghost", "role": "member"}, format="json"
    )
    assert response.status_code == 400 and response.json()["field"] == "username"


def test_adding_with_an_unknown_role_names_role(client_as, admin, outsider):
    response = client_as("admin").post(
        "/api/v1/projects/vision/members/", {"username": "oscar-outsider", "role": "owner"}, format="json"
    )
    assert response.status_code == 400 and response.json()["field"] == "role"


def test_adding_an_existing_member_is_a_conflict(client_as, admin, viewer):
    response = client_as("admin").post(
        "/api/v1/projects/vision/members/", {"username": "vera-viewer", "role": "member"}, format="json"
    )
    assert response.status_code == 409
    assert Membership.objects.get(user=viewer).role == Role.VIEWER


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("member", 403),
        ("creator", 403),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_changing_a_role_is_for_admins_only(client_as, admin, member, viewer, creator, role, status):
    response = client_as(role).patch("/api/v1/projects/vision/members/vera-viewer/", {"role": "member"}, format="json")
    assert response.status_code == status
    assert Membership.objects.get(user=viewer).role == (Role.MEMBER if status == 200 else Role.VIEWER)
    if status == 200:
        assert response.json()["role"] == "member"


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 204),
        ("member", 403),
        ("creator", 403),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_removing_a_member_is_for_admins_only(client_as, admin, member, viewer, creator, role, status):
    response = client_as(role).delete("/api/v1/projects/vision/members/mike-member/")
    assert response.status_code == status
    assert Membership.objects.filter(user=member).exists() == (status != 204)


def test_the_last_admin_can_be_neither_demoted_nor_removed(client_as, admin):
    client = client_as("admin")
    demote = client.patch("/api/v1/projects/vision/members/alice-admin/", {"role": "member"}, format="json")
    remove = client.delete("/api/v1/projects/vision/members/alice-admin/")
    assert (demote.status_code, remove.status_code) == (409, 409)
    assert Membership.objects.get(user=admin).role == Role.ADMIN


def test_changing_a_non_member_answers_404(client_as, admin, outsider):
    response = client_as("admin").patch(
        "/api/v1/projects/vision/members/oscar-outsider/", {"role": "member"}, format="json"
    )
    assert response.status_code == 404 and response.json()["field"] == "username"
