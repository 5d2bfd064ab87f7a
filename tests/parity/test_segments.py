"""A Run resumed under its id keeps what each resume logs again below its floor as that resume's segment, out of
the Run's series, and compares it with the series: a verdict per segment, with the restore report its writer sent
(docs/design/resume.md#same-run-parity)."""

import math
import random
import struct

import pytest
from django.db import IntegrityError, transaction

from checkpoints.models import Checkpoint, CheckpointState
from mado.errors import Forbidden, LeaseLost, ValidationFailed
from parity.models import BLOCK_STEPS, Parity, ParityBlock
from parity.services import parity_tolerance_set, restore_report_record, segment_verdict_refresh
from runs.charts import run_charts
from runs.metrics import metrics_ingest
from runs.models import MetricPoint, ResumeSegment, Run, RunStatus, SegmentPoint
from runs.resume import run_start
from runs.segments import bits_to_values
from tests.factories import RunFactory
from tests.parity.conftest import KEYS, curve

pytestmark = pytest.mark.django_db


@pytest.fixture
def same_run(project, creator, log):
    """Run ``exp-1`` that logged steps 0–29, saved a checkpoint at step 20 and crashed."""
    run = RunFactory(project=project, created_by=creator, external_id="exp-1", status=RunStatus.FAILED)
    log(run, range(30))
    Checkpoint.objects.create(run=run, step=20, state=CheckpointState.COMPLETE, file_count=1, total_bytes=10)
    return run


def resume(run) -> Run:
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, heartbeat_at=None)
    return run_start(actor=run.created_by, project=run.project, external_id=run.external_id, resume="allow").run


def segment(run, number=1) -> ResumeSegment:
    return ResumeSegment.objects.get(run=run, number=number)


def test_a_resume_opens_a_segment_at_the_floor_with_the_writers_token(same_run):
    resumed = resume(same_run)
    opened = segment(resumed)
    assert (opened.floor, opened.lease_token, opened.verdict) == (30, resumed.lease_token, "unknown")


def test_the_documented_resume_replays_identically_and_the_series_keeps_the_first_points(same_run, log):
    resumed = resume(same_run)
    result = log(resumed, range(20, 40))
    assert (result.stored, result.compared, result.dropped) == (20, 20, 0)
    found = segment(resumed)
    assert (found.verdict, found.first_step, found.last_step, found.compared_points) == ("identical", 20, 29, 20)
    assert found.compared_keys == sorted(KEYS)
    assert MetricPoint.objects.filter(run=resumed, key="train.loss", step=25).count() == 1
    assert Run.objects.get(pk=resumed.pk).dropped_points == 0


def test_a_replay_that_differs_is_diverged_at_its_first_step_with_key_and_both_values(same_run, log):
    resumed = resume(same_run)
    log(resumed, range(20, 30), value=lambda key, step: curve(key, step) + (0.5 if step >= 23 else 0.0))
    found = segment(resumed)
    assert (found.verdict, found.step, found.key) == ("diverged", 23, "train.accuracy")
    assert found.parent_value == curve("train.accuracy", 23)
    assert found.child_value == curve("train.accuracy", 23) + 0.5
    stored = MetricPoint.objects.get(run=resumed, key="train.accuracy", step=23).value
    assert stored == curve("train.accuracy", 23), "the series keeps the first value"


def test_a_tiny_difference_is_within_tolerance_and_follows_the_projects_tolerance(same_run, log, admin):
    resumed = resume(same_run)
    log(resumed, range(20, 30), value=lambda key, step: curve(key, step) * (1 + 1e-9))
    assert segment(resumed).verdict == "within_tolerance"
    parity_tolerance_set(actor=admin, project=resumed.project, tolerance=0.0)
    assert segment(resumed).verdict == "diverged"


def test_nan_equals_nan_and_nan_against_a_number_diverges(project, creator, log):
    run = RunFactory(project=project, created_by=creator, external_id="nan", status=RunStatus.FAILED)
    log(run, range(5), keys=("loss",), value=lambda key, step: math.nan if step == 3 else float(step))
    resumed = resume(run)
    log(resumed, range(2, 5), keys=("loss",), value=lambda key, step: math.nan if step == 3 else float(step))
    assert segment(resumed).verdict == "identical"
    log(resumed, [4], keys=("loss",), value=lambda key, step: math.nan)
    found = segment(resumed)
    assert (found.verdict, found.step, found.parent_value, found.child_value) == ("diverged", 4, 4.0, None)


def test_a_replay_of_steps_the_series_never_held_is_unknown(same_run, log):
    resumed = resume(same_run)
    log(resumed, range(20, 25), keys=("val.loss",))
    found = segment(resumed)
    assert (found.verdict, found.compared_points) == ("unknown", 0)
    assert SegmentPoint.objects.filter(segment=found).count() == 5


def test_an_idempotent_replay_of_a_batch_stores_nothing_twice(same_run, django_capture_on_commit_callbacks):
    resumed = resume(same_run)
    body = {"keys": ["train.loss"] * 3, "steps": [21, 22, 30], "values": [curve("train.loss", s) for s in (21, 22, 30)]}
    with django_capture_on_commit_callbacks(execute=True):
        first = metrics_ingest(actor=resumed.created_by, run=resumed, columns=body, idempotency_key="b1")
        again = metrics_ingest(actor=resumed.created_by, run=resumed, columns=body, idempotency_key="b1")
    assert (first.stored, first.compared, again.replayed, again.compared) == (1, 2, True, 0)
    assert SegmentPoint.objects.filter(segment__run=resumed).count() == 2
    assert segment(resumed).compared_points == 2


def test_a_step_sent_twice_keeps_the_value_sent_last(same_run, log):
    resumed = resume(same_run)
    log(resumed, [21], keys=("train.loss",), value=lambda key, step: 9.0)
    assert segment(resumed).verdict == "diverged"
    log(resumed, [21], keys=("train.loss",))
    assert segment(resumed).verdict == "identical"


def test_two_resumes_each_get_their_own_segment_compared_with_what_the_series_held(same_run, log):
    first = resume(same_run)
    log(first, range(20, 40))
    second = resume(first)
    assert segment(second, 2).floor == 40
    log(second, range(35, 45), value=lambda key, step: curve(key, step) + (1.0 if step == 38 else 0.0))
    assert segment(second, 1).verdict == "identical"
    found = segment(second, 2)
    assert (found.verdict, found.step, found.first_step, found.last_step) == ("diverged", 38, 35, 39)


def test_a_stale_writer_cannot_add_points_to_the_new_segment(same_run, log):
    first = resume(same_run)
    stale_token = first.lease_token
    second = resume(first)
    with pytest.raises(LeaseLost):
        metrics_ingest(
            actor=second.created_by,
            run=first,
            columns={"keys": ["train.loss"], "steps": [21], "values": [5.0]},
            fencing_token=stale_token,
        )
    assert not SegmentPoint.objects.filter(segment__run=second).exists()


def test_the_restore_report_is_kept_on_the_run_and_on_the_current_segment(same_run):
    resumed = resume(same_run)
    checkpoint = Checkpoint.objects.get(run=resumed, step=20)
    body = {
        "checkpoint_id": checkpoint.pk,
        "parts": {"model": "restored", "data_position": "not_restored", "rng.torch": "not_restored"},
        "details": {"data_position": "the loader started the epoch again"},
    }
    report, _ = restore_report_record(
        actor=resumed.created_by, run=resumed, body=body, fencing_token=resumed.lease_token
    )
    found = segment(resumed)
    assert (found.checkpoint_id, found.checkpoint_step) == (checkpoint.pk, 20)
    assert found.not_restored == ["data_position", "rng.torch"] == report.not_restored
    assert found.restore_details == body["details"]


def test_the_run_resource_lists_each_segment_with_its_verdict_and_restore_report(same_run, log, api, viewer):
    resumed = resume(same_run)
    log(resumed, range(20, 30), value=lambda key, step: -1.0 if step == 26 else curve(key, step))
    restore_report_record(
        actor=resumed.created_by, run=resumed, body={"parts": {"model": "restored", "rng.python": "not_restored"}}
    )
    body = api(viewer).get(f"/api/v1/runs/{resumed.pk}/").json()
    (found,) = body["resume_segments"]
    assert (found["number"], found["floor"], found["verdict"], found["step"], found["key"]) == (
        1,
        30,
        "diverged",
        26,
        "train.accuracy",
    )
    assert found["child_value"] == -1.0 and found["restore_report"]["not_restored"] == ["rng.python"]


def test_the_run_overview_shows_each_resume_with_its_verdict_and_what_it_did_not_restore(same_run, log, login, viewer):
    resumed = resume(same_run)
    log(resumed, range(20, 30), value=lambda key, step: -1.0 if step == 26 else curve(key, step))
    restore_report_record(
        actor=resumed.created_by,
        run=resumed,
        body={
            "checkpoint_id": Checkpoint.objects.get(run=resumed, step=20).pk,
            "parts": {"model": "restored", "data_position": "not_restored"},
            "details": {"data_position": "the loader started the epoch again"},
        },
    )
    html = login(viewer).get(f"/runs/{resumed.pk}/").content.decode()
    assert 'class="resume-segment" data-number="1" data-verdict="diverged"' in html
    assert "Resume 1 from the checkpoint at step 20" in html
    assert "Logged again, step 26 differs: train.accuracy was" in html
    assert "Not restored from the checkpoint: data_position." in html and "the loader started the epoch again" in html
    assert 'title="Compared with the steps this run logged first"' in html, "a segment has no parent run"


@pytest.mark.parametrize(
    "columns, field",
    [
        ({"keys": ["train.loss", "x" * 251], "steps": [21, 22], "values": [1.0, 2.0]}, "keys[1]"),
        ({"keys": ["train.loss", "train.loss"], "steps": [21, -1], "values": [1.0, 2.0]}, "steps[1]"),
        ({"keys": ["train.loss", "train.loss"], "steps": [21, 22], "values": [1.0, "nope"]}, "values[1]"),
    ],
)
def test_a_hostile_point_below_the_floor_refuses_the_whole_batch_and_keeps_nothing(same_run, columns, field):
    resumed = resume(same_run)
    with pytest.raises(ValidationFailed) as refused:
        metrics_ingest(actor=resumed.created_by, run=resumed, columns=columns)
    assert refused.value.field == field
    assert not SegmentPoint.objects.filter(segment__run=resumed).exists()


def test_a_reader_cannot_add_points_to_a_segment(same_run, viewer):
    resumed = resume(same_run)
    with pytest.raises(Forbidden):
        metrics_ingest(actor=viewer, run=resumed, columns={"keys": ["train.loss"], "steps": [21], "values": [1.0]})
    assert not SegmentPoint.objects.filter(segment__run=resumed).exists()


def test_a_run_started_from_a_checkpoint_as_a_new_run_has_no_segment_and_its_parity_is_unchanged(child, log):
    log(child, range(20, 25))
    assert not ResumeSegment.objects.filter(run=child).exists()
    assert child.parity.compared_points == 0


def test_the_runs_chart_draws_each_resumes_replayed_steps_dashed_beside_the_first_ones(same_run, log):
    resumed = resume(same_run)
    log(resumed, range(20, 35), value=lambda key, step: math.nan if step == 22 else curve(key, step) + 1)
    charts = {chart.key: chart for chart in run_charts(run=Run.objects.get(pk=resumed.pk))}
    run_series, replayed = charts["train.loss"].series
    assert [point[0] for point in run_series.points] == list(range(35))
    assert (replayed.label, replayed.dashed, replayed.color) == ("Resume 1, logged again", True, 1)
    assert [point[0] for point in replayed.points] == [20, 21, *range(23, 30)], "NaN is not drawn"
    assert replayed.points[0][1] == curve("train.loss", 20) + 1
    assert [(m.step, m.kind) for m in charts["train.loss"].markers] == [(30, "resume")]


def test_the_django_admin_lists_segments_read_only(same_run, log, client, django_user_model):
    resumed = resume(same_run)
    log(resumed, range(20, 30))
    operator = django_user_model.objects.create_superuser("ops", "ops@example.com", "x")
    client.force_login(operator)
    listing = client.get("/admin/runs/resumesegment/")
    assert listing.status_code == 200 and "identical" in listing.content.decode()
    assert client.get("/admin/runs/resumesegment/add/").status_code == 403


# --- Kept current block by block (parity.services.blocks), values bit for bit -----------------------------------

FIELDS = ("verdict", "step", "key", "parent_value", "child_value", "compared_points", "compared_steps")
FIELDS += ("compared_keys", "first_step", "last_step", "max_difference")


def verdict_fields(run, number=1) -> tuple:
    found = segment(run, number)
    return tuple(getattr(found, name) for name in FIELDS)


def long_run(project, creator, log, name, steps=300):
    run = RunFactory(project=project, created_by=creator, external_id=name, status=RunStatus.FAILED)
    log(run, range(steps))
    return resume(run)


def replayed(key, step):
    """What a resume replays: the first values, but one step differs by 1e-9 relative and two diverge."""
    value = curve(key, step)
    if step == 70:
        return value * (1 + 1e-9)
    return value + 1.0 if (key, step) in {("train.loss", 250), ("train.accuracy", 130)} else value


def test_many_small_batches_in_any_order_give_the_verdict_of_one_big_batch(project, creator, log):
    big = long_run(project, creator, log, "big")
    log(big, range(300), value=replayed)
    small = long_run(project, creator, log, "small")
    batches = [range(start, start + 7) for start in range(0, 300, 7)]
    random.Random(5).shuffle(batches)
    for steps in batches:
        log(small, steps, value=replayed)
    assert verdict_fields(small) == verdict_fields(big)
    assert verdict_fields(big)[:3] == ("diverged", 130, "train.accuracy")
    assert segment(big).compared_points == 600 and segment(big).compared_steps == 300


def test_a_late_point_into_an_early_block_changes_the_verdict_and_a_correction_restores_it(project, creator, log):
    resumed = long_run(project, creator, log, "late")
    for start in range(100, 300, 50):
        log(resumed, range(start, start + 50))
    assert segment(resumed).verdict == "identical"
    log(resumed, [3], keys=("train.loss",), value=lambda key, step: -1.0)
    found = segment(resumed)
    assert (found.verdict, found.step, found.key, found.child_value) == ("diverged", 3, "train.loss", -1.0)
    assert (found.first_step, found.compared_points) == (3, 401)
    log(resumed, [3], keys=("train.loss",))
    assert (segment(resumed).verdict, segment(resumed).compared_points) == ("identical", 401)


def test_a_batch_compares_again_only_the_blocks_it_reached(project, creator, log):
    resumed = long_run(project, creator, log, "blocks")
    log(resumed, range(300))
    opened = segment(resumed)
    assert ParityBlock.objects.filter(segment=opened).count() == 2 * math.ceil(300 / BLOCK_STEPS)
    ParityBlock.objects.filter(segment=opened, block=0).update(identical=False)  # a block no batch reaches now
    log(resumed, [200], keys=("train.loss",))
    assert segment(resumed).verdict == "within_tolerance", "block 0 was not compared again"
    segment_verdict_refresh(segment_id=opened.pk)  # everything: what a tolerance change does
    assert segment(resumed).verdict == "identical"


def test_batches_whose_refreshes_run_late_out_of_order_or_twice_leave_the_current_verdict(
    same_run, django_capture_on_commit_callbacks
):
    resumed = resume(same_run)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        for steps, shift in (([20, 21, 22], 0.0), ([23, 24], 0.5), ([23], 0.0)):
            columns = {"keys": [], "steps": [], "values": []}
            for step in steps:
                columns["keys"].append("train.loss")
                columns["steps"].append(step)
                columns["values"].append(curve("train.loss", step) + shift)
            metrics_ingest(actor=resumed.created_by, run=resumed, columns=columns)
    for callback in [*reversed(callbacks), *callbacks]:  # the last batch's refresh first; each twice
        callback()
    found = segment(resumed)
    assert (found.verdict, found.step, found.compared_points) == ("diverged", 24, 5)


@pytest.mark.parametrize("first, again", [(0.0, -0.0), (-0.0, 0.0)])
def test_zero_and_negative_zero_differ_so_the_replay_is_not_identical(project, creator, log, first, again):
    run = RunFactory(project=project, created_by=creator, external_id="zero", status=RunStatus.FAILED)
    log(run, range(3), keys=("loss",), value=lambda key, step: first)
    assert math.copysign(1.0, MetricPoint.objects.get(run=run, key="loss", step=1).value) == math.copysign(1.0, first)
    resumed = resume(run)
    log(resumed, range(3), keys=("loss",), value=lambda key, step: again)
    found = segment(resumed)
    assert (found.verdict, found.compared_points, found.max_difference) == ("within_tolerance", 3, 0.0)
    log(resumed, range(3), keys=("loss",), value=lambda key, step: first)
    assert segment(resumed).verdict == "identical"


def test_every_value_a_segment_keeps_reads_back_bit_for_bit(same_run, log):
    resumed = resume(same_run)
    sent = [-0.0, 0.0, math.inf, -math.inf, math.nan, 5e-324, -1.7976931348623157e308]
    log(resumed, range(20, 27), keys=("odd",), value=lambda key, step: sent[step - 20])
    bits = SegmentPoint.objects.filter(segment__run=resumed).order_by("step").values_list("value_bits", flat=True)
    assert [struct.pack("<d", value) for value in bits_to_values(list(bits)).tolist()] == [
        struct.pack("<d", value) for value in sent
    ]


def test_a_block_belongs_to_a_verdict_or_a_segment_never_both_nor_neither(same_run, child, log):
    resumed = resume(same_run)
    log(resumed, range(20, 30))
    fields = dict(key="k", block=0, mask=1, compared=1, identical=True, first_step=0, last_step=0, max_difference=0.0)
    log(child, range(20, 25))
    for owners in ({}, {"segment": segment(resumed), "parity": Parity.objects.get(run=child)}):
        with pytest.raises(IntegrityError), transaction.atomic():
            ParityBlock.objects.create(**owners, **fields)


def test_a_resume_that_changes_a_parameter_reads_changed_on_purpose_on_its_segment(same_run, log, api, login, viewer):
    Run.objects.filter(pk=same_run.pk).update(parameters={"lr": 0.1})
    log(same_run, range(30), keys=["train.lr"], value=lambda key, step: 0.1)
    Run.objects.filter(pk=same_run.pk).update(status=RunStatus.FAILED, heartbeat_at=None)
    resumed = run_start(
        actor=same_run.created_by,
        project=same_run.project,
        external_id="exp-1",
        resume="allow",
        allow_param_change=True,
        parameters={"lr": 0.05},
    ).run
    log(resumed, range(20, 30), keys=[*KEYS, "train.lr"], value=lambda key, step: 0.05 if key == "train.lr" else 9.0)
    assert (segment(resumed).verdict, segment(resumed).step) == ("diverged", 20)
    (found,) = api(viewer).get(f"/api/v1/runs/{resumed.pk}/").json()["resume_segments"]
    (change,) = found["declared"]["changes"]
    assert (change["key"], change["old_value"], change["new_value"], change["took_effect_at_step"]) == (
        "lr",
        0.1,
        0.05,
        20,
    )
    assert found["declared"]["divergence_declared"] is True
    html = login(viewer).get(f"/runs/{resumed.pk}/").content.decode()
    assert "Changed on purpose from step 20, as declared below" in html
    assert "changed on purpose: lr 0.1 → 0.05" in html and "(took effect at step 20)" in html


def test_a_resume_that_changed_nothing_has_no_declared_changes_and_an_unloaded_checkpoint_reads_not_known(
    same_run, log, api, login, viewer
):
    resumed = resume(same_run)
    log(resumed, range(20, 30))
    restore_report_record(
        actor=resumed.created_by,
        run=resumed,
        body={
            "parts": {"model": "unknown", "optimizer": "not_restored"},
            "details": {"model": "not loaded through mado_tracking"},
        },
    )
    (found,) = api(viewer).get(f"/api/v1/runs/{resumed.pk}/").json()["resume_segments"]
    assert found["declared"] is None and found["restore_report"]["unknown"] == ["model"]
    html = login(viewer).get(f"/runs/{resumed.pk}/").content.decode()
    assert "Not restored from the checkpoint: optimizer." in html
    assert "Not known what was restored from the checkpoint: model." in html, "both lines, not the first only"
