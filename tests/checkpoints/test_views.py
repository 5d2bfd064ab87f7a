"""Checkpoint and artifact pages: the Checkpoint tab (docs/design/checkpoints.md#keep-count), the manifest page,
deletion (docs/design/checkpoints.md#deletion), the Artifacts tab (docs/design/interfaces.md#surfaces)."""

import hashlib
import io
import os
import re

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import Artifact, Checkpoint, CheckpointState
from runs.models import RunKind
from tests.checkpoints.checkpoint_helpers import declaration, make_tar
from tests.factories import RunFactory


def saved(run, actor, step: int, files=None, **fields) -> Checkpoint:
    """A complete checkpoint of real tar bytes, registered, uploaded and completed through the services."""
    files = files or {"model.pt": f"weights {step}".encode(), "optim/state.pt": b"s" * step}
    tar = make_tar(files)
    checkpoint, _ = services.checkpoint_register(actor=actor, run=run, step=step, **fields)
    services.checkpoint_upload(actor=actor, checkpoint=checkpoint, source=io.BytesIO(tar), expected_size=len(tar))
    return services.checkpoint_complete(actor=actor, checkpoint=checkpoint, **declaration(tar, files))


def stored_files(settings) -> list[str]:
    root = settings.STORAGES["artifacts"]["OPTIONS"]["location"]
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def shown_steps(response) -> list[int]:
    """Steps of the Checkpoint tab's rows, top to bottom."""
    html = response.content.decode()
    return [int(part.split('"', 1)[0]) for part in html.split('<tr data-step="')[1:]]


@pytest.fixture
def seven(run, creator, django_capture_on_commit_callbacks):
    """Steps 10..70 complete (K = 5 keeps 70..30) and a pending step 80."""
    with django_capture_on_commit_callbacks(execute=True):
        rows = {
            step: saved(run, creator, step, framework="torch", includes_optimizer=step % 20 == 0)
            for step in range(10, 80, 10)
        }
    rows[80], _ = services.checkpoint_register(actor=creator, run=run, step=80)
    return rows


def tab(run, **query):
    url = reverse("runs:run-checkpoints", args=[run.pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


# --- the Checkpoint tab (docs/design/checkpoints.md#keep-count) -------------------------------------------------------


def test_the_tab_lists_the_newest_k_complete_checkpoints_with_their_facts(login, viewer, run, seven):
    response = login(viewer).get(tab(run))
    assert response.status_code == 200
    assert shown_steps(response) == [70, 60, 50, 40, 30]
    html = response.content.decode()
    assert "Show older checkpoints beyond the keep count (2)" in html
    assert f'href="/api/v1/checkpoints/{seven[70].pk}/tar"' in html
    assert f'href="/checkpoints/{seven[70].pk}/"' in html
    assert "torch" in html and ">yes<" in html and ">no<" in html
    assert "bytes" in html  # human-readable size (filesizeformat), exact count in the title


def test_a_big_checkpoint_shows_its_size_human_readable(login, viewer, run, seven):
    Checkpoint.objects.filter(pk=seven[70].pk).update(total_bytes=1_288_490_189)
    html = login(viewer).get(tab(run)).content.decode()
    assert "1.2\xa0GB" in html and 'title="1288490189 bytes"' in html


def test_the_keep_count_comes_from_the_setting(login, viewer, run, seven, settings):
    settings.MMT_CHECKPOINT_KEEP_COUNT = 3
    response = login(viewer).get(tab(run))
    assert shown_steps(response) == [70, 60, 50]
    assert "Show older checkpoints beyond the keep count (4)" in response.content.decode()


def test_the_toggle_shows_older_checkpoints_and_marks_pending_and_deleted_ones_unusable(
    login, admin, run, seven, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(actor=admin, checkpoint=seven[10])
    response = login(admin).get(tab(run, older=1))
    assert shown_steps(response) == [80, 70, 60, 50, 40, 30, 20, 10]
    html = response.content.decode()
    assert "Hide older checkpoints" in html and "Show older checkpoints" not in html
    assert '<tr data-step="80" data-state="pending"' in html and '<tr data-step="10" data-state="deleted"' in html
    for unusable in (seven[80], seven[10]):
        assert f"/api/v1/checkpoints/{unusable.pk}/tar" not in html
    assert reverse("checkpoints:checkpoint-delete", args=[seven[10].pk]) not in html
    assert "Deleted " in html and f" by {admin.username}" in html
    # an admin may clear away an unfinished upload (the service allows it; it is no keep slot, no source)
    assert reverse("checkpoints:checkpoint-delete", args=[seven[80].pk]) in html


def test_pending_and_deleted_checkpoints_are_not_in_the_default_list(
    login, admin, run, seven, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(actor=admin, checkpoint=seven[10])
    html = login(admin).get(tab(run)).content.decode()
    assert 'data-state="pending"' not in html and 'data-state="deleted"' not in html
    assert "Show older checkpoints beyond the keep count (1)" in html


def test_looking_at_the_list_deletes_nothing(login, admin, run, seven, settings):
    before = stored_files(settings)
    login(admin).get(tab(run))
    login(admin).get(tab(run, older=1))
    assert stored_files(settings) == before
    assert Checkpoint.objects.filter(run=run, state=CheckpointState.COMPLETE).count() == 7


def test_a_run_with_few_checkpoints_has_no_toggle(login, viewer, run, creator):
    saved(run, creator, 5)
    response = login(viewer).get(tab(run))
    assert shown_steps(response) == [5] and "Show older checkpoints" not in response.content.decode()


# --- the checkpoint page: manifest and download -----------------------------------------------


def test_the_checkpoint_page_shows_the_manifest_and_downloads_the_tar(login, viewer, run, creator):
    files = {"model.pt": b"w" * 3000, "optim/state.pt": b"o" * 700, "empty.bin": b""}
    checkpoint = saved(run, creator, 12, files=files, framework="torch", includes_optimizer=True)
    client = login(viewer)
    response = client.get(reverse("checkpoints:checkpoint-detail", args=[checkpoint.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    for path, data in files.items():
        assert f"<code>{path}</code>" in html and hashlib.sha256(data).hexdigest() in html
    assert "2.9\xa0KB" in html and checkpoint.tar_sha256 in html and "checkpoints/step-12.tar" in html
    download = client.get(f"/api/v1/checkpoints/{checkpoint.pk}/tar")  # the page's link, with the session
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == make_tar(files)


def test_the_checkpoint_page_offers_continue_training_to_a_member_and_says_why_not_to_a_viewer(
    login, viewer, member, run, seven
):
    continue_url = f'href="/checkpoints/{seven[70].pk}/continue/"'
    page = login(member).get(reverse("checkpoints:checkpoint-detail", args=[seven[70].pk])).content.decode()
    assert continue_url in page and "Continue training" in page
    watcher = login(viewer).get(reverse("checkpoints:checkpoint-detail", args=[seven[70].pk])).content.decode()
    assert continue_url not in watcher and 'class="reason continue-refusal"' in watcher
    pending = login(member).get(reverse("checkpoints:checkpoint-detail", args=[seven[80].pk])).content.decode()
    assert "/continue/" not in pending  # not complete: no weights to continue from


def test_a_deleted_checkpoints_page_keeps_the_manifest_without_download(
    login, admin, run, seven, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_delete(actor=admin, checkpoint=seven[20])
    html = login(admin).get(reverse("checkpoints:checkpoint-detail", args=[seven[20].pk])).content.decode()
    assert "state-deleted" in html and "<code>model.pt</code>" in html
    assert f"/api/v1/checkpoints/{seven[20].pk}/tar" not in html


# --- permissions ---------------------------------------------------------------------------


def page_urls(run, checkpoint) -> list[str]:
    return [
        tab(run),
        tab(run, older=1),
        reverse("checkpoints:checkpoint-detail", args=[checkpoint.pk]),
        reverse("checkpoints:checkpoint-delete", args=[checkpoint.pk]),
        reverse("runs:run-artifacts", args=[run.pk]),
        reverse("checkpoints:artifact-delete", args=[run.pk]) + "?path=" + checkpoint.artifact_path,
    ]


@pytest.mark.parametrize("role", ["admin", "member", "creator", "viewer"])
def test_every_role_sees_the_pages(login, request, run, seven, role):
    client = login(request.getfixturevalue(role))
    for url in page_urls(run, seven[10]):
        assert client.get(url).status_code == 200, url


def test_an_outsider_gets_404_everywhere(login, outsider, run, seven):
    client = login(outsider)
    for url in page_urls(run, seven[10]):
        assert client.get(url).status_code == 404, url
    assert client.post(reverse("checkpoints:checkpoint-delete", args=[seven[10].pk])).status_code == 404
    response = client.post(reverse("checkpoints:artifact-delete", args=[run.pk]), {"path": seven[10].artifact_path})
    assert response.status_code == 404
    assert Checkpoint.objects.get(pk=seven[10].pk).state == CheckpointState.COMPLETE


def test_anonymous_is_sent_to_the_login_page(client, run, seven):
    for url in page_urls(run, seven[10]):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login") + "?next="), url
    response = client.post(reverse("checkpoints:checkpoint-delete", args=[seven[10].pk]))
    assert response.status_code == 302 and Checkpoint.objects.get(pk=seven[10].pk).state == CheckpointState.COMPLETE


# --- deletion (docs/design/checkpoints.md#deletion) -------------------------------------------------------------------


def test_an_admin_deletes_an_old_checkpoint_through_the_confirmation(
    login, admin, run, seven, settings, django_capture_on_commit_callbacks
):
    client = login(admin)
    target = seven[20]
    key = target.artifact.storage_key
    delete_url = reverse("checkpoints:checkpoint-delete", args=[target.pk])
    assert f'href="{delete_url}"' in client.get(tab(run, older=1)).content.decode()
    confirm = client.get(delete_url).content.decode()
    assert "Delete the checkpoint at step 20?" in confirm and 'type="submit"' in confirm
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(delete_url, follow=True)
    assert response.redirect_chain[-1][0] == tab(run, older=1)
    assert "The checkpoint at step 20 was deleted." in response.content.decode()
    target.refresh_from_db()
    assert target.state == CheckpointState.DELETED and target.deleted_by == admin and target.artifact is None
    assert key not in stored_files(settings) and not Artifact.objects.filter(storage_key=key).exists()
    assert '<tr data-step="20" data-state="deleted"' in response.content.decode()


@pytest.mark.parametrize(
    "role, sentence",
    [
        ("member", "Only project admins can do this."),
        ("creator", "Only project admins can do this."),
        ("viewer", "Your role in this project is viewer: viewers can only read."),
    ],
)
def test_a_non_admin_sees_the_reason_instead_of_the_button_and_cannot_post(
    login, request, run, seven, settings, role, sentence
):
    client = login(request.getfixturevalue(role))
    html = client.get(tab(run, older=1)).content.decode()
    # Said once above the table, not on each of the 8 rows.
    assert html.count(sentence) == 1
    assert f'<span class="{"continue" if role == "viewer" else "delete"}-refusal">{sentence}</span>' in html
    assert f"checkpoints/{seven[10].pk}/delete/" not in html
    confirm = client.get(reverse("checkpoints:checkpoint-delete", args=[seven[10].pk])).content.decode()
    assert sentence in confirm and 'type="submit" class="danger"' not in confirm
    before = stored_files(settings)
    assert client.post(reverse("checkpoints:checkpoint-delete", args=[seven[10].pk])).status_code == 403
    assert (
        Checkpoint.objects.get(pk=seven[10].pk).state == CheckpointState.COMPLETE and stored_files(settings) == before
    )


def test_a_checkpoint_inside_the_keep_count_shows_why_and_is_refused(login, admin, run, seven, settings):
    client = login(admin)
    reason = "The checkpoint at step 50 is one of the newest 5 complete checkpoints of this run, which are kept"
    html = client.get(tab(run)).content.decode()
    # The keep rule is said once in the tab's head; the row is marked "kept" and has no Delete button.
    assert html.count("The newest 5 complete checkpoints of this run: they are kept and cannot be deleted.") == 1
    assert "MMT_CHECKPOINT_KEEP_COUNT" not in html and reason not in html
    row = re.search(r'<tr data-step="50"[^>]*>(.*?)</tr>', html, re.S).group(1)
    assert '<span class="badge state-kept"' in row
    assert reverse("checkpoints:checkpoint-delete", args=[seven[50].pk]) not in html
    before = stored_files(settings)
    response = client.post(reverse("checkpoints:checkpoint-delete", args=[seven[50].pk]), follow=True)
    assert response.status_code == 200 and reason in response.content.decode()
    assert 'class="message error"' in response.content.decode()
    assert (
        Checkpoint.objects.get(pk=seven[50].pk).state == CheckpointState.COMPLETE and stored_files(settings) == before
    )


def test_the_source_checkpoint_of_a_run_shows_why_and_is_refused(login, admin, project, creator, run, seven):
    resumed = RunFactory(
        project=project, created_by=creator, name="resumed", kind=RunKind.TRAINING, source_checkpoint=seven[20]
    )
    client = login(admin)
    reason = f"The checkpoint at step 20 is the source checkpoint of run resumed (#{resumed.pk})"
    assert reason in client.get(tab(run, older=1)).content.decode()
    assert reason in client.get(reverse("checkpoints:checkpoint-detail", args=[seven[20].pk])).content.decode()
    response = client.post(reverse("checkpoints:checkpoint-delete", args=[seven[20].pk]), follow=True)
    assert reason in response.content.decode()
    assert Checkpoint.objects.get(pk=seven[20].pk).state == CheckpointState.COMPLETE


def test_a_checkpoint_that_became_a_source_after_the_confirmation_is_refused_with_a_message(
    login, admin, project, creator, run, seven
):
    client = login(admin)
    delete_url = reverse("checkpoints:checkpoint-delete", args=[seven[10].pk])
    assert 'type="submit" class="danger"' in client.get(delete_url).content.decode()
    RunFactory(project=project, created_by=creator, name="late-resume", source_checkpoint=seven[10])  # meanwhile
    response = client.post(delete_url, follow=True)
    assert response.status_code == 200 and "source checkpoint of run late-resume" in response.content.decode()
    assert Checkpoint.objects.get(pk=seven[10].pk).state == CheckpointState.COMPLETE


def test_deleting_twice_is_harmless(login, admin, run, seven, django_capture_on_commit_callbacks):
    client = login(admin)
    delete_url = reverse("checkpoints:checkpoint-delete", args=[seven[10].pk])
    with django_capture_on_commit_callbacks(execute=True):
        client.post(delete_url)
        second = client.post(delete_url, follow=True)
    assert second.status_code == 200
    assert Checkpoint.objects.get(pk=seven[10].pk).state == CheckpointState.DELETED


def test_the_reasons_are_shown_in_japanese(login, admin, member, run, seven):
    client = login(admin)
    client.post(reverse("set_language"), {"language": "ja", "next": "/"})
    html = client.get(tab(run)).content.decode()
    assert "保持数を超える古いチェックポイントを表示 (2)" in html
    assert "このRunの最新の完了済みチェックポイント 5 件です。これらは保持され、削除できません。" in html
    client.force_login(member)
    client.post(reverse("set_language"), {"language": "ja", "next": "/"})
    assert "この操作はプロジェクトの管理者だけが実行できます。" in client.get(tab(run)).content.decode()


# --- the Artifacts tab ----------------------------------------------------------------------------


@pytest.fixture
def files(run, creator, seven):
    """A plain file of the Run beside its checkpoint tars."""
    artifact, _ = services.artifact_store(
        actor=creator, run=run, path="logs/train output.txt", source=io.BytesIO(b"hello\n" * 100)
    )
    return artifact


def test_the_artifacts_tab_lists_files_with_size_digest_and_download(login, viewer, run, seven, files):
    client = login(viewer)
    response = client.get(reverse("runs:run-artifacts", args=[run.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("<tr data-path=") == 8  # 7 checkpoint tars + the log (the pending one has no file yet)
    assert f'title="{files.sha256}">{files.sha256[:12]}…</code>' in html
    assert "600\xa0bytes" in html
    link = f"/api/v1/runs/{run.pk}/artifacts/logs/train%20output.txt"
    assert f'href="{link}"' in html
    download = client.get(link)
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"hello\n" * 100


def test_an_admin_deletes_a_plain_file_but_a_checkpoint_tar_shows_why_not(
    login, admin, run, seven, files, settings, django_capture_on_commit_callbacks
):
    client = login(admin)
    html = client.get(reverse("runs:run-artifacts", args=[run.pk])).content.decode()
    assert "This file is the tar of the checkpoint at step 10: delete the checkpoint on the Checkpoints tab." in html
    delete_url = reverse("checkpoints:artifact-delete", args=[run.pk])
    assert f'href="{delete_url}?path=logs/train%20output.txt"' in html
    assert 'type="submit"' in client.get(delete_url, {"path": files.path}).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(delete_url, {"path": files.path}, follow=True)
    assert "logs/train output.txt was deleted." in response.content.decode()
    assert not Artifact.objects.filter(pk=files.pk).exists() and files.storage_key not in stored_files(settings)

    tar = seven[10].artifact
    response = client.post(delete_url, {"path": tar.path}, follow=True)  # the service's 409, shown as a message
    assert response.status_code == 200 and f"is the tar of checkpoint {seven[10].pk}" in response.content.decode()
    assert Artifact.objects.filter(pk=tar.pk).exists() and tar.storage_key in stored_files(settings)


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_a_non_admin_cannot_delete_a_file(login, request, run, files, role):
    client = login(request.getfixturevalue(role))
    html = client.get(reverse("runs:run-artifacts", args=[run.pk])).content.decode()
    assert reverse("checkpoints:artifact-delete", args=[run.pk]) not in html
    response = client.post(reverse("checkpoints:artifact-delete", args=[run.pk]), {"path": files.path})
    assert response.status_code == 403 and Artifact.objects.filter(pk=files.pk).exists()


def test_deleting_a_missing_file_is_404(login, admin, run):
    response = login(admin).post(reverse("checkpoints:artifact-delete", args=[run.pk]), {"path": "nope.txt"})
    assert response.status_code == 404
