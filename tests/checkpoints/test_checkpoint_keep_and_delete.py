"""Keep-count listing and its toggle (docs/design/checkpoints.md#keep-count), deletion rules
(docs/design/checkpoints.md#deletion) and the permission matrix of every endpoint."""

import io
import os

import pytest

from checkpoints import selectors, services
from checkpoints.models import Artifact, Checkpoint, CheckpointState
from mado.errors import Conflict, Forbidden
from tests.checkpoints.checkpoint_helpers import declaration, make_tar, put_tar, register, save
from tests.factories import RunFactory


def stored_files(settings):
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def saved(run, actor, step: int) -> Checkpoint:
    """A complete checkpoint through the services (fast path for listing tests)."""
    files = {"model.pt": f"weights {step}".encode()}
    tar = make_tar(files)
    checkpoint, _ = services.checkpoint_register(actor=actor, run=run, step=step)
    services.checkpoint_upload(actor=actor, checkpoint=checkpoint, source=io.BytesIO(tar), expected_size=len(tar))
    return services.checkpoint_complete(actor=actor, checkpoint=checkpoint, **declaration(tar, files))


@pytest.fixture
def keep3(settings):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 3


@pytest.fixture
def seven(run, creator, keep3, django_capture_on_commit_callbacks):
    """Steps 10..70 complete, plus a pending step 80: K = 3 keeps 70, 60, 50."""
    with django_capture_on_commit_callbacks(execute=True):
        rows = {step: saved(run, creator, step) for step in range(10, 80, 10)}
    rows[80], _ = services.checkpoint_register(actor=creator, run=run, step=80)
    return rows


# --- keep-count listing (docs/design/checkpoints.md#keep-count) -------------------------------------------------------


def test_the_list_shows_the_newest_k_and_counts_the_older_ones(run, seven):
    shown, hidden = selectors.checkpoint_list_for_run(run=run, include_older=False)
    assert [(c.step, c.within_keep_count) for c in shown] == [(70, True), (60, True), (50, True)]
    assert hidden == 4


def test_the_toggle_shows_older_checkpoints_flagged_outside_the_keep_count(run, seven):
    shown, hidden = selectors.checkpoint_list_for_run(run=run, include_older=True)
    assert [(c.step, c.within_keep_count) for c in shown] == [
        (70, True),
        (60, True),
        (50, True),
        (40, False),
        (30, False),
        (20, False),
        (10, False),
    ]
    assert hidden == 0
    with_unusable, _ = selectors.checkpoint_list_for_run(run=run, include_older=False, include_unusable=True)
    assert [(c.step, c.state, c.within_keep_count) for c in with_unusable][0] == (80, "pending", False)


def test_a_pending_or_deleted_checkpoint_never_takes_a_keep_slot(run, seven, admin, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(actor=admin, checkpoint=seven[40])
    kept = selectors.checkpoint_kept_ids(run_id=run.pk)
    assert kept == {seven[70].pk, seven[60].pk, seven[50].pk}


def test_the_api_lists_complete_checkpoints_newest_first_with_the_flag(api, viewer, run, seven):
    body = api(viewer).get(f"/api/v1/runs/{run.pk}/checkpoints/").json()
    assert body["count"] == 7
    assert [(c["step"], c["within_keep_count"]) for c in body["results"]][:4] == [
        (70, True),
        (60, True),
        (50, True),
        (40, False),
    ]
    everything = api(viewer).get(f"/api/v1/runs/{run.pk}/checkpoints/?all=1").json()
    assert everything["count"] == 8 and everything["results"][0]["state"] == "pending"


def test_leaving_the_keep_count_deletes_nothing(run, creator, seven, settings, django_capture_on_commit_callbacks):
    before = stored_files(settings)
    with django_capture_on_commit_callbacks(execute=True):
        saved(run, creator, 90)
    assert set(before) <= set(stored_files(settings))
    assert Checkpoint.objects.filter(run=run, state=CheckpointState.COMPLETE).count() == 8


def test_keep_counts_are_per_run(project, creator, run, seven, keep3, django_capture_on_commit_callbacks):
    other = RunFactory(project=project, created_by=creator)
    with django_capture_on_commit_callbacks(execute=True):
        lone = saved(other, creator, 10)
    assert selectors.checkpoint_kept_ids(run_id=other.pk) == {lone.pk}
    assert selectors.checkpoint_get_for_user(user=creator, checkpoint_id=seven[70].pk).within_keep_count is True
    assert selectors.checkpoint_get_for_user(user=creator, checkpoint_id=seven[10].pk).within_keep_count is False


# --- deletion (docs/design/checkpoints.md#deletion) -------------------------------------------------------------------


def test_an_admin_deletes_an_older_checkpoint_keeping_the_row(
    api, admin, run, seven, settings, django_capture_on_commit_callbacks
):
    target = seven[10]
    key = target.artifact.storage_key
    with django_capture_on_commit_callbacks(execute=True):
        response = api(admin).delete(f"/api/v1/checkpoints/{target.pk}/")
    assert response.status_code == 204
    target.refresh_from_db()
    assert target.state == CheckpointState.DELETED and target.artifact is None and target.deleted_by == admin
    assert target.tar_sha256 and target.manifest.count() == 1  # the record stays
    assert key not in stored_files(settings) and not Artifact.objects.filter(storage_key=key).exists()
    assert api(admin).get(f"/api/v1/checkpoints/{target.pk}/").json()["state"] == "deleted"
    assert api(admin).get(f"/api/v1/checkpoints/{target.pk}/tar").status_code == 409
    assert api(admin).delete(f"/api/v1/checkpoints/{target.pk}/").status_code == 204  # again: nothing to do
    assert register(api(admin), run, 10).status_code == 409  # the step stays taken


def test_a_checkpoint_inside_the_keep_count_cannot_be_deleted(api, admin, seven, settings):
    before = stored_files(settings)
    response = api(admin).delete(f"/api/v1/checkpoints/{seven[50].pk}/")
    assert response.status_code == 409
    assert "newest 3 complete checkpoints" in response.json()["detail"]
    assert Checkpoint.objects.get(pk=seven[50].pk).state == CheckpointState.COMPLETE
    assert stored_files(settings) == before


def test_the_source_checkpoint_of_a_run_cannot_be_deleted(api, admin, project, creator, seven, settings):
    resumed = RunFactory(project=project, created_by=creator, name="resumed", source_checkpoint=seven[20])
    response = api(admin).delete(f"/api/v1/checkpoints/{seven[20].pk}/")
    assert response.status_code == 409
    assert f"source checkpoint of run resumed (#{resumed.pk})" in response.json()["detail"]
    assert Checkpoint.objects.get(pk=seven[20].pk).state == CheckpointState.COMPLETE


def test_a_pending_checkpoint_can_be_deleted_and_its_upload_goes(
    admin, creator, run, settings, django_capture_on_commit_callbacks
):
    checkpoint, _ = services.checkpoint_register(actor=creator, run=run, step=3)
    tar = make_tar()
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_upload(actor=creator, checkpoint=checkpoint, source=io.BytesIO(tar), expected_size=len(tar))
    assert len(stored_files(settings)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(actor=admin, checkpoint=checkpoint)
    assert stored_files(settings) == [] and Checkpoint.objects.get(pk=checkpoint.pk).state == "deleted"


@pytest.mark.parametrize("role", ["member", "creator", "viewer"])
def test_only_a_project_admin_deletes(request, seven, role):
    user = request.getfixturevalue(role)
    with pytest.raises(Forbidden):
        services.checkpoint_delete(actor=user, checkpoint=seven[10])
    assert Checkpoint.objects.get(pk=seven[10].pk).state == CheckpointState.COMPLETE


def test_the_delete_blocker_gives_the_reason_shown_in_place_of_the_button(
    admin, member, viewer, project, creator, seven
):
    RunFactory(project=project, created_by=creator, name="child", source_checkpoint=seven[20])
    blocker = selectors.checkpoint_delete_blocker
    assert blocker(user=admin, checkpoint=seven[10]) is None
    assert "newest 3" in blocker(user=admin, checkpoint=seven[70])
    assert "source checkpoint of run child" in blocker(user=admin, checkpoint=seven[20])
    assert blocker(user=member, checkpoint=seven[10]) == "Only project admins can do this."
    assert "viewer" in blocker(user=viewer, checkpoint=seven[10])
    batch = selectors.checkpoint_delete_blockers(user=admin, run=seven[10].run, checkpoints=seven.values())
    assert batch[seven[10].pk] is None and batch[seven[20].pk] and batch[seven[70].pk]


def test_the_delete_service_refuses_under_its_locks_what_the_blocker_refuses(admin, seven):
    with pytest.raises(Conflict) as refused:
        services.checkpoint_delete(actor=admin, checkpoint=seven[60])
    assert refused.value.detail == selectors.checkpoint_delete_blocker(user=admin, checkpoint=seven[60])


# --- permission matrix ---------------------------------------------------------------------------


@pytest.fixture
def ready(api, creator, run, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        older = save(api(creator), run, 1)
        for step in range(2, 8):
            save(api(creator), run, step)
    return older


READS = ["runs/{run}/checkpoints/", "checkpoints/{ckpt}/", "checkpoints/{ckpt}/tar"]


@pytest.mark.parametrize("path", READS)
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
def test_reads_permission_matrix(client_as, run, ready, path, role, status):
    response = client_as(role).get("/api/v1/" + path.format(run=run.pk, ckpt=ready["id"]))
    assert response.status_code == status


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 201),
        ("member", 403),
        ("creator", 201),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_register_permission_matrix(client_as, run, role, status):
    assert register(client_as(role), run, 1).status_code == status
    assert Checkpoint.objects.exists() == (status == 201)


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("member", 403),
        ("creator", 200),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_upload_and_complete_permission_matrix(client_as, api, creator, run, settings, role, status):
    pending = register(api(creator), run, 1).json()
    tar = make_tar()
    assert put_tar(client_as(role), pending["id"], tar).status_code == status
    assert len(stored_files(settings)) == (1 if status == 200 else 0)
    put_tar(api(creator), pending["id"], tar)
    response = client_as(role).post(f"/api/v1/checkpoints/{pending['id']}/complete/", declaration(tar), format="json")
    assert response.status_code == status
    parts = client_as(role).post(f"/api/v1/checkpoints/{pending['id']}/upload-parts/", {"tar_size": 1}, format="json")
    assert parts.status_code == {200: 409}.get(status, status)  # 409 for writers: not S3 storage


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
def test_delete_permission_matrix(client_as, ready, role, status):
    assert client_as(role).delete(f"/api/v1/checkpoints/{ready['id']}/").status_code == status
    expected = CheckpointState.DELETED if status == 204 else CheckpointState.COMPLETE
    assert Checkpoint.objects.get(pk=ready["id"]).state == expected
