"""The checkpoint janitor (docs/design/checkpoints.md#a-checkpoint; docs/design/worker.md#subprocess): no checkpoint
stays pending after its Run ended or its upload lease expired, and the reason its upload failed stays on it."""

import io
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from checkpoints import filesystem, services
from checkpoints.models import Checkpoint, CheckpointState
from checkpoints.services.direct import VERIFY_TASK
from checkpoints.tasks import end_abandoned_checkpoints
from mado import outbox
from mado.outbox import dispatch_reap_overdue
from runs.models import Run, RunStatus
from tests.checkpoints.checkpoint_helpers import FILES, FillsUp, make_tar, put_tar, register
from tests.checkpoints.test_checkpoint_services import stored_files, uploaded_directly

TAR = make_tar(FILES)


def half_uploaded(run, creator, step: int) -> Checkpoint:
    """A pending checkpoint whose tar is in the storage but was never completed (the SDK was killed)."""
    checkpoint = services.checkpoint_register(actor=creator, run=run, step=step)[0]
    services.checkpoint_upload(actor=creator, checkpoint=checkpoint, source=io.BytesIO(TAR), expected_size=len(TAR))
    return Checkpoint.objects.get(pk=checkpoint.pk)


def end_run(run, *, ago: float) -> None:
    Run.objects.filter(pk=run.pk).update(status=RunStatus.ABORTED, ended_at=timezone.now() - timedelta(seconds=ago))


def test_a_pending_checkpoint_of_an_ended_run_ends_in_error_and_its_bytes_go(
    run, creator, settings, django_capture_on_commit_callbacks
):
    settings.MADO_CHECKPOINT_ENDED_GRACE = 60
    checkpoint = half_uploaded(run, creator, 10)
    assert stored_files(settings), "the tar is stored while pending"
    end_run(run, ago=30)
    assert end_abandoned_checkpoints() == 0, "within the grace the SDK may still finish"
    end_run(run, ago=61)
    with django_capture_on_commit_callbacks(execute=True):
        assert end_abandoned_checkpoints() == 1
    checkpoint.refresh_from_db()
    assert checkpoint.state == CheckpointState.ERROR
    assert checkpoint.error == "The Run ended before the upload was finished; save the checkpoint again."
    assert stored_files(settings) == []
    assert end_abandoned_checkpoints() == 0, "ended once"


def test_an_upload_past_its_lease_ends_in_error_while_the_run_is_still_running(run, creator, settings):
    settings.MADO_CHECKPOINT_UPLOAD_LEASE = 3600
    checkpoint = services.checkpoint_register(actor=creator, run=run, step=3)[0]
    Checkpoint.objects.filter(pk=checkpoint.pk).update(created_at=timezone.now() - timedelta(seconds=3601))
    fresh = services.checkpoint_register(actor=creator, run=run, step=4)[0]
    assert services.checkpoint_end_abandoned() == 1
    assert Checkpoint.objects.get(pk=checkpoint.pk).error.startswith(
        "The upload was not finished within its lease of 3600 s"
    )
    assert Checkpoint.objects.get(pk=fresh.pk).state == CheckpointState.PENDING


def test_an_upload_awaiting_its_verification_is_left_to_the_verification(run, creator, settings):
    settings.MADO_CHECKPOINT_ENDED_GRACE = 0
    checkpoint = uploaded_directly(services.checkpoint_register(actor=creator, run=run, step=5)[0], TAR, FILES)
    end_run(run, ago=10)
    assert services.checkpoint_end_abandoned() == 0
    assert Checkpoint.objects.get(pk=checkpoint.pk).state == CheckpointState.PENDING


def test_a_verification_that_never_runs_ends_the_checkpoint_in_error(
    run, creator, settings, django_capture_on_commit_callbacks, monkeypatch
):
    from celery import current_app

    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args=(), **options: sent.append((name, args)))
    settings.MADO_DISPATCH_TIMEOUT = 100
    checkpoint = uploaded_directly(services.checkpoint_register(actor=creator, run=run, step=6)[0], TAR, FILES)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():  # as complete_direct_upload does
        outbox.dispatch_create(task=VERIFY_TASK, args=[checkpoint.pk], queue="cpu", task_id="verify-6")
    assert sent == [("worker.tasks.checkpoint_verify", [checkpoint.pk])]
    later = timezone.now() + timedelta(seconds=101)
    assert dispatch_reap_overdue(now=later) == 1 and len(sent) == 2
    assert dispatch_reap_overdue(now=later + timedelta(seconds=101)) == 1
    checkpoint.refresh_from_db()
    assert checkpoint.state == CheckpointState.ERROR
    assert checkpoint.error.startswith("The checkpoint was never verified. No worker took it from queue 'cpu'")


def test_the_next_start_may_save_an_errored_step_again(run, creator):
    old = services.checkpoint_register(actor=creator, run=run, step=7, idempotency_key="save-7")[0]
    services.checkpoint_end_in_error(checkpoint_id=old.pk, error="The Run ended before the upload was finished.")
    again, created = services.checkpoint_register(actor=creator, run=run, step=7, idempotency_key="save-7")
    assert created and again.pk != old.pk and again.state == CheckpointState.PENDING
    assert not Checkpoint.objects.filter(pk=old.pk).exists()


def test_the_reason_an_upload_failed_stays_first_when_the_janitor_ends_the_checkpoint(
    api, run, creator, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.MADO_CHECKPOINT_ENDED_GRACE = 0
    client = api(creator)
    pending = register(client, run, 10).json()
    real_open = open  # the volume fills up 100,000 bytes into the tar
    monkeypatch.setattr(filesystem, "open", lambda *args, **kw: FillsUp(real_open(*args, **kw), 100_000), raising=False)
    assert put_tar(client, pending["id"], make_tar({"model.pt": b"w" * 300_000})).status_code == 507
    monkeypatch.undo()
    recorded = client.get(f"/api/v1/checkpoints/{pending['id']}/").json()["error"]
    assert "ran out of space after" in recorded, "premise: the failed upload recorded why"
    end_run(run, ago=10)
    with django_capture_on_commit_callbacks(execute=True):
        assert end_abandoned_checkpoints() == 1
    shown = client.get(f"/api/v1/checkpoints/{pending['id']}/").json()
    assert shown["state"] == CheckpointState.ERROR
    assert shown["error"] == f"{recorded}\nThe Run ended before the upload was finished; save the checkpoint again."
