"""Scrubbing: a checkpoint whose stored object was altered is marked corrupt by one pass, is no longer offered for
resume, and "resume from latest" takes the one before; the rate holds (docs/design/checkpoints.md#scrubbing)."""

import html
from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointState
from checkpoints.services.scrub import checkpoint_scrub_pass
from jobs.selectors import latest_resume_checkpoint
from runs.hooks import checkpoint_corrupt
from tests.checkpoints.checkpoint_helpers import save

pytestmark = pytest.mark.django_db


@pytest.fixture
def saved(api, creator, run):
    client = api(creator)
    return [Checkpoint.objects.get(pk=save(client, run, step)["id"]) for step in (1, 2, 3)]


def alter_stored_tar(checkpoint: Checkpoint) -> None:
    """Flip one byte of the checkpoint's stored tar, as a failing disk or a careless operator would."""
    path = storage.artifact_storage().path(checkpoint.artifact.storage_key)
    with open(path, "r+b") as stored:
        stored.seek(600)
        byte = stored.read(1)
        stored.seek(600)
        stored.write(bytes([byte[0] ^ 0xFF]))


def test_one_pass_marks_an_altered_checkpoint_corrupt_and_resume_skips_it(
    login, creator, run, saved, django_capture_on_commit_callbacks
):
    alter_stored_tar(saved[2])
    heard = []

    def receiver(sender, checkpoint, reason, **kwargs):
        heard.append((checkpoint.pk, reason))

    checkpoint_corrupt.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            outcome = checkpoint_scrub_pass(rate=10**12)
    finally:
        checkpoint_corrupt.disconnect(receiver)
    assert outcome.corrupt == [saved[2].pk] and sorted(outcome.verified) == [saved[0].pk, saved[1].pk]
    corrupt = Checkpoint.objects.get(pk=saved[2].pk)
    assert corrupt.state == CheckpointState.CORRUPT
    assert "the tar: the stored object's SHA-256 is" in corrupt.error
    assert heard == [(corrupt.pk, corrupt.error)]
    assert all(Checkpoint.objects.get(pk=c.pk).verified_at for c in saved[:2])
    assert latest_resume_checkpoint(run=run) == saved[1]
    page = login(creator).get(f"/runs/{run.pk}/checkpoints/").content.decode()
    row = html.unescape(page.split('data-step="3"', 1)[1].split("</tr>", 1)[0])
    assert "corrupt" in row and "Not offered for resume" in row and corrupt.error in row
    assert "checkpoint-resume" not in row and f"/checkpoints/{corrupt.pk}/resume/" not in row
    detail = login(creator).get(f"/checkpoints/{corrupt.pk}/").content.decode()
    assert "Not offered for resume" in detail and "/continue/" not in detail


def test_a_missing_object_is_corrupt_and_an_unchanged_one_stays_complete(run, saved):
    storage.artifact_storage().delete(saved[0].artifact.storage_key)
    outcome = checkpoint_scrub_pass(rate=10**12)
    assert outcome.corrupt == [saved[0].pk]
    assert Checkpoint.objects.get(pk=saved[0].pk).error == "the tar: the stored object is missing"
    assert Checkpoint.objects.filter(state=CheckpointState.COMPLETE).count() == 2


def test_the_rate_holds_with_a_small_budget(run, saved, settings):
    size = saved[0].tar_size
    assert all(c.tar_size == size for c in saved)
    settings.MADO_REAPER_INTERVAL = 1
    start = timezone.now()
    first = checkpoint_scrub_pass(now=start, rate=size)  # one second's worth: nothing fits
    assert first.bytes == 0
    hour = checkpoint_scrub_pass(now=start + timedelta(hours=1), rate=size)
    assert (hour.verified, hour.bytes) == ([saved[0].pk], size), "an hour's budget reads exactly one"
    half = checkpoint_scrub_pass(now=start + timedelta(hours=1, minutes=30), rate=size)
    assert half.verified == [] and half.bytes == 0
    later = checkpoint_scrub_pass(now=start + timedelta(hours=2), rate=size)
    assert later.verified == [saved[1].pk], "the oldest never-verified one next"
    idle = checkpoint_scrub_pass(now=start + timedelta(days=30), rate=size)
    assert idle.verified == [saved[2].pk], "a month idle earns one hour's worth, not a burst"
    again = checkpoint_scrub_pass(now=start + timedelta(days=30, hours=1), rate=size)
    assert again.verified == [saved[0].pk], "then the least recently verified"


def test_the_storage_page_and_usage_api_say_when_the_project_was_last_fully_scrubbed(
    login, api, viewer, project, saved, django_capture_on_commit_callbacks
):
    def page() -> str:
        text = login(viewer).get(f"/projects/{project.slug}/storage/").content.decode()
        return html.unescape(text.split('class="scrub-state"', 1)[1].split("</p>", 1)[0])

    assert "Not yet fully scrubbed: 0 of 3 complete checkpoints read back and matched." in page()
    alter_stored_tar(saved[0])
    with django_capture_on_commit_callbacks(execute=True):
        checkpoint_scrub_pass(rate=10**12)
    usage = api(viewer).get(f"/api/v1/projects/{project.slug}/usage/").json()["scrub"]
    oldest = min(Checkpoint.objects.get(pk=c.pk).verified_at for c in saved[1:])
    assert usage["complete"] == 2 and usage["verified"] == 2 and usage["corrupt"] == 1
    assert usage["last_full_scrub"].replace("Z", "+00:00") == oldest.isoformat()
    shown = page()
    assert f"last read back and matched by {timezone.localtime(oldest):%Y-%m-%d %H:%M}" in shown
    assert "1 checkpoint was found corrupt." in shown
