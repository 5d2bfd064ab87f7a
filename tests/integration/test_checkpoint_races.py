"""Races on a real PostgreSQL: delete vs. a Run taking the checkpoint as its source
(docs/design/checkpoints.md#deletion), duplicate registration.

The "resume-source" transaction below is the protocol every resume / continue
service follows: lock the checkpoint row, refuse unless it is complete,
create the Run that points at it. ``checkpoint_delete`` locks the same row,
so exactly one of the two wins and no Run ever points at a deleted checkpoint.
"""

import io
import threading
import time

import pytest
from django.db import connection, transaction

from checkpoints import selectors, services
from checkpoints.models import Checkpoint, CheckpointState
from mado.errors import Conflict
from runs.models import Run
from tests.checkpoints.checkpoint_helpers import declaration, make_tar

pytestmark = pytest.mark.django_db(transaction=True)


def resume_source(*, checkpoint_id: int, creator) -> Run | None:
    """Create a Run whose source is the checkpoint, after locking its row; None when it is not complete."""
    with transaction.atomic():
        row = Checkpoint.objects.select_for_update().select_related("run").get(pk=checkpoint_id)
        if row.state != CheckpointState.COMPLETE:
            return None
        return Run.objects.create(
            project_id=row.run.project_id,
            created_by=creator,
            parent_id=row.run_id,
            source_checkpoint=row,
            name=f"resumed from {row.pk}",
        )


def in_thread(target, *args, **kwargs):
    """Run ``target`` on a thread with its own database connection; ``.result`` / ``.error`` after ``join``."""

    def body():
        try:
            worker.result = target(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            worker.error = exc
        finally:
            connection.close()

    worker = threading.Thread(target=body, daemon=True)
    worker.result, worker.error = None, None
    worker.start()
    return worker


def saved(run, actor, step: int) -> Checkpoint:
    files = {"model.pt": f"weights {step}".encode()}
    tar = make_tar(files)
    checkpoint, _ = services.checkpoint_register(actor=actor, run=run, step=step)
    services.checkpoint_upload(actor=actor, checkpoint=checkpoint, source=io.BytesIO(tar), expected_size=len(tar))
    return services.checkpoint_complete(actor=actor, checkpoint=checkpoint, **declaration(tar, files))


@pytest.fixture
def older(postgres, settings, run, creator, admin):
    """Complete checkpoints at steps 1..21 with a keep count of 1: steps 1..20 may be deleted."""
    settings.MMT_CHECKPOINT_KEEP_COUNT = 1
    return [saved(run, creator, step) for step in range(1, 22)][:-1]


def no_run_points_at_a_deleted_checkpoint() -> bool:
    return not Run.objects.filter(source_checkpoint__state=CheckpointState.DELETED).exists()


def test_a_resume_holding_the_row_makes_the_delete_wait_then_refuse(older, admin, creator):
    target, go, locked = older[0], threading.Event(), threading.Event()

    def slow_resume():
        with transaction.atomic():
            row = Checkpoint.objects.select_for_update().get(pk=target.pk)
            locked.set()
            go.wait(10)
            assert row.state == CheckpointState.COMPLETE
            return Run.objects.create(project_id=row.run.project_id, created_by=creator, source_checkpoint=row)

    resume = in_thread(slow_resume)
    assert locked.wait(10)
    delete = in_thread(services.checkpoint_delete, actor=admin, checkpoint=target)
    time.sleep(0.5)
    assert delete.is_alive(), "the delete must wait for the resume's row lock"
    go.set()
    resume.join(10)
    delete.join(10)
    assert resume.error is None and resume.result.source_checkpoint_id == target.pk
    assert isinstance(delete.error, Conflict) and "source checkpoint of run" in delete.error.detail
    assert Checkpoint.objects.get(pk=target.pk).state == CheckpointState.COMPLETE


def test_a_delete_holding_the_rows_makes_the_resume_wait_then_refuse(older, admin, creator, monkeypatch):
    target, go, locked = older[0], threading.Event(), threading.Event()
    real = selectors.checkpoint_delete_refusal

    def refusal_then_pause(**kwargs):
        reason = real(**kwargs)
        locked.set()
        go.wait(10)
        return reason

    monkeypatch.setattr(selectors, "checkpoint_delete_refusal", refusal_then_pause)
    delete = in_thread(services.checkpoint_delete, actor=admin, checkpoint=target)
    assert locked.wait(10)
    resume = in_thread(resume_source, checkpoint_id=target.pk, creator=creator)
    time.sleep(0.5)
    assert resume.is_alive(), "the resume must wait for the delete's row locks"
    go.set()
    delete.join(10)
    resume.join(10)
    assert delete.error is None and resume.error is None and resume.result is None
    assert Checkpoint.objects.get(pk=target.pk).state == CheckpointState.DELETED
    assert not Run.objects.filter(source_checkpoint_id=target.pk).exists()


def test_delete_and_resume_started_together_exactly_one_wins_every_time(older, admin, creator):
    outcomes = set()
    for target in older:
        barrier = threading.Barrier(2)

        def delete(target=target, barrier=barrier):
            barrier.wait(10)
            return services.checkpoint_delete(actor=admin, checkpoint=target)

        def resume(target=target, barrier=barrier):
            barrier.wait(10)
            return resume_source(checkpoint_id=target.pk, creator=creator)

        deleter, resumer = in_thread(delete), in_thread(resume)
        deleter.join(20)
        resumer.join(20)
        assert resumer.error is None
        deleted = deleter.error is None
        created = resumer.result is not None
        assert deleted != created, f"checkpoint {target.pk}: deleted={deleted} created={created}"
        if not deleted:
            assert isinstance(deleter.error, Conflict) and "source checkpoint" in deleter.error.detail
        state = Checkpoint.objects.get(pk=target.pk).state
        assert state == (CheckpointState.DELETED if deleted else CheckpointState.COMPLETE)
        outcomes.add("delete" if deleted else "resume")
    assert no_run_points_at_a_deleted_checkpoint()
    assert Run.objects.filter(source_checkpoint__isnull=False).count() + Checkpoint.objects.filter(
        state=CheckpointState.DELETED
    ).count() == len(older)


def test_concurrent_registrations_of_one_step_create_one_checkpoint(postgres, run, creator):
    for step, keys in ((5, ("a", "b")), (6, ("same", "same"))):
        barrier = threading.Barrier(2)

        def register(key, barrier=barrier, step=step):
            barrier.wait(10)
            return services.checkpoint_register(actor=creator, run=run, step=step, idempotency_key=key)

        first, second = in_thread(register, keys[0]), in_thread(register, keys[1])
        first.join(10)
        second.join(10)
        results = [t.result for t in (first, second) if t.error is None]
        errors = [t.error for t in (first, second) if t.error is not None]
        assert Checkpoint.objects.filter(run=run, step=step).count() == 1
        if keys[0] == keys[1]:
            assert not errors and {r[0].pk for r in results} == {Checkpoint.objects.get(run=run, step=step).pk}
            assert sorted(r[1] for r in results) == [False, True]
        else:
            assert len(results) == 1 and results[0][1] is True
            assert len(errors) == 1 and isinstance(errors[0], Conflict)
            assert errors[0].detail == f"step {step} is already saved in this run"
