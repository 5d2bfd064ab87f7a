"""Keeping each resumed Run's parity verdict current as metric batches commit (docs/design/resume.md#parity).

``parity_after_batch`` runs after every metrics batch commits (``runs.hooks.metrics_stored``). For a Run that is
neither a resumed Run nor the parent of one it costs one indexed query. Otherwise only the blocks of the
batch's keys and steps that lie in the overlap (from the checkpoint's step to the other Run's last step) are
compared again, under the verdict's row lock, from the points as stored then; a batch past the overlap reads
nothing more. So the cost follows the overlap, never the Runs' size, and two batches that commit at once (a
parent still logging while its continued child logs) cannot leave a stale verdict: each reads after its own
commit, and the one that locks last has seen both.
"""

from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q

from checkpoints.models import Checkpoint
from parity.compare import compare_cells
from parity.models import Parity
from parity.points import last_logged_step, latest_values
from parity.selectors import project_tolerance
from parity.services.blocks import block_span, blocks_fold, blocks_store
from runs import hooks
from runs.charts import is_system_key
from runs.models import MetricSummary, Run

_PARITY = Parity._meta.db_table
_TOUCHING = f"""
SELECT p.id, p.run_id, p.checkpoint_step, p.child_first_step,
       (SELECT max(s.last_step) FROM {MetricSummary._meta.db_table} s
        WHERE s.run_id = CASE WHEN p.run_id = %s THEN p.parent_id ELSE p.run_id END)
FROM {_PARITY} p WHERE p.run_id = %s OR p.parent_id = %s
"""


def parity_after_batch(*, run: Run, steps: dict[str, tuple[int, int]]) -> None:
    """Bring the verdicts ``run`` takes part in up to date after a batch committed (docs/design/resume.md#parity);
    ``steps`` maps each key of the batch to its first and last step in it (ints).

    The SDK's system metrics (``system/…``) are samples of the machine,
    not of training: they are never compared, and a batch of them alone
    costs nothing here.

    ``run`` needs ``pk``, ``parent_id``, ``source_checkpoint_id`` and
    ``project_id``. A Run started from a checkpoint gets its ``Parity`` row
    at its first batch (compared over the whole overlap once); its lowest
    logged step is kept for the "resume ignored?" signal. As the parent or
    the child of a verdict, the batch's blocks in the overlap are compared
    again. Safe to call twice for one batch.
    """
    trained = {key: span for key, span in steps.items() if not is_system_key(key)}
    if not trained:
        return
    keys = sorted(trained)
    first_step = min(first for first, _last in trained.values())
    last_step = max(last for _first, last in trained.values())
    with connection.cursor() as cursor:
        cursor.execute(_TOUCHING, [run.pk, run.pk, run.pk])
        rows = cursor.fetchall()
    if run.parent_id and run.source_checkpoint_id and not any(row[1] == run.pk for row in rows):
        parity_id = parity_open(run=run)
        if parity_id is not None:
            _lower_first_step(parity_id, first_step)
            parity_recompute(parity_id=parity_id)
    for parity_id, child_id, start, child_first, other_last in rows:
        if child_id == run.pk and (child_first is None or first_step < child_first):
            _lower_first_step(parity_id, first_step)
        low, high = max(first_step, start), last_step if other_last is None else min(last_step, other_last)
        if other_last is not None and low <= high:
            _refresh(parity_id=parity_id, keys=keys, low=low, high=high)


def parity_open(*, run: Run) -> int | None:
    """The id of ``run``'s ``Parity`` row, created (verdict ``unknown``) when missing; None when its source
    checkpoint is gone. Two concurrent calls create one row (the unique ``run``). The row records whether the
    checkpoint holds a training state, so a restore report was due before these first metrics
    (docs/design/resume.md#checkpoint-not-loaded)."""
    found = (
        Checkpoint.objects.filter(pk=run.source_checkpoint_id)
        .annotate(holds_state=ExpressionWrapper(Q(metadata__has_key="training_state"), output_field=BooleanField()))
        .values_list("step", "holds_state")
        .first()
    )
    if found is None:
        return None
    step, holds_state = found
    try:
        with transaction.atomic():
            parity = Parity.objects.create(
                run_id=run.pk,
                parent_id=run.parent_id,
                checkpoint_step=step,
                tolerance=project_tolerance(project_id=run.project_id),
                expects_restore_report=bool(holds_state),
            )
            return parity.pk
    except IntegrityError:
        return Parity.objects.filter(run_id=run.pk).values_list("pk", flat=True).first()


def parity_recompute(*, parity_id: int) -> None:
    """Compare the whole overlap of verdict ``parity_id`` again, with the Project's current tolerance: at its
    creation and after the tolerance changed. Reads the points of both Runs from the checkpoint's step to the
    lower of their last steps."""
    _refresh(parity_id=parity_id, keys=None, low=None, high=None)


def _lower_first_step(parity_id: int, step: int) -> None:
    """Record ``step`` as the child's lowest logged step unless a lower one is known (one conditional UPDATE)."""
    lower = Q(child_first_step__isnull=True) | Q(child_first_step__gt=step)
    Parity.objects.filter(lower, pk=parity_id).update(child_first_step=step)


@transaction.atomic
def _refresh(*, parity_id: int, keys: list[str] | None, low: int | None, high: int | None) -> None:
    """Compare again the blocks of ``keys`` (None: all) holding steps ``low`` to ``high`` (None: the whole
    overlap), under the verdict's row lock, then fold every block into the verdict."""
    parity = Parity.objects.select_for_update(of=("self",)).select_related("run").filter(pk=parity_id).first()
    if parity is None:
        return
    tolerance = project_tolerance(project_id=parity.run.project_id)
    if tolerance != parity.tolerance:  # the Project's tolerance changed since: every block depends on it
        parity.tolerance, keys, low, high = tolerance, None, None, None
    start = parity.checkpoint_step
    if high is None:
        lasts = [last_logged_step(run_id=parity.parent_id), last_logged_step(run_id=parity.run_id)]
        high = None if None in lasts else min(lasts)
    low = start if low is None else max(low, start)
    if high is not None and low <= high:
        read_low, read_high = block_span(low, high)
        read_low = max(start, read_low)
        before = latest_values(run_id=parity.parent_id, keys=keys, low=read_low, high=read_high)
        after = latest_values(run_id=parity.run_id, keys=keys, low=read_low, high=read_high)
        blocks_store(owner={"parity": parity}, cells=compare_cells(before, after, tolerance=parity.tolerance))
    _fold(parity)


def _fold(parity: Parity) -> None:
    """Write the verdict folded from every block of ``parity`` (locked); announce a change of verdict, step or key
    on commit (``runs.hooks.parity_changed``)."""
    previous = (parity.verdict, parity.step, parity.key)
    fields = blocks_fold(owner={"parity": parity})
    for name, value in fields.items():
        setattr(parity, name, value)
    parity.save(update_fields=[*fields, "tolerance", "updated_at"])
    if (parity.verdict, parity.step, parity.key) != previous:
        transaction.on_commit(
            lambda: hooks.parity_changed.send(sender=Parity, parity=parity, previous=previous[0]), robust=True
        )
