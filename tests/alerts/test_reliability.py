"""The lost-work ledger and the checkpoint interval it recommends equal a hand computation
(docs/design/alerts.md#reliability)."""

import pytest
from django.utils import timezone

from alerts.models import Failure
from checkpoints.models import Checkpoint, CheckpointState
from runs.liveness import runs_reap_crashed
from runs.models import Run, RunStatus
from runs.resume import run_start
from tests.alerts import history
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def test_the_reliability_api_answers_the_hand_computed_figures(api, project, creator, viewer):
    runs = history.seed_history(project, creator)

    body = api(viewer).get(f"/api/v1/projects/{project.slug}/reliability/").json()

    assert body["gpu_hours_lost"] == pytest.approx(history.GPU_HOURS_LOST)
    assert body["failures"] == 3
    assert body["mtbf_hours"] == pytest.approx(history.MTBF_H, abs=1e-3)
    by_run = {row["run_id"]: row for row in body["ledger"]}
    assert {name: by_run[runs[name].pk]["gpu_hours_lost"] for name in history.LOST} == history.LOST
    assert by_run[runs["r1"].pk]["restart_s"] == 1800 and by_run[runs["r1"].pk]["resumed_by"] == runs["r1c"].pk
    assert runs["r4"].pk not in by_run
    assert [(w["week"], w["failures"], w["gpu_hours_lost"]) for w in body["weeks"]] == history.WEEKS
    queues = {q["queue"]: q["mtbf_h"] for q in body["queues"]}
    assert queues == {"gpu-a100": history.MTBF_A100_H, "cpu": history.MTBF_CPU_H, "(no queue)": None}
    [trainer] = [c for c in body["codes"] if c["code"] == "trainer"]
    assert trainer["checkpoint_stall_s"] == history.STALL_S
    assert trainer["checkpoint_interval_s"] == history.INTERVAL_S
    assert trainer["young_daly_interval_s"] == pytest.approx(history.YOUNG_DALY_S, abs=1e-3)
    assert trainer["saved_gpu_hours"] == pytest.approx(history.SAVED_GPU_H, abs=1e-3)
    assert trainer["extra_stall_gpu_hours"] == pytest.approx(history.EXTRA_STALL_GPU_H, abs=1e-3)


def test_the_resumed_run_page_links_its_lost_work_to_its_parent(login, project, creator):
    runs = history.seed_history(project, creator)

    page = login(creator).get(f"/runs/{runs['r1c'].pk}/").content.decode()

    assert "Resumed after run r1-crashed was lost: 20.00 GPU-hours" in page


def test_a_project_with_no_loss_says_so(login, project, creator):
    page = login(creator).get(f"/projects/{project.slug}/reliability/").content.decode()
    assert "No run of this project was lost" in page


def test_the_reliability_and_alerts_pages_speak_japanese(client, project, admin):
    client.force_login(admin)
    client.cookies["django_language"] = "ja"

    reliability = client.get(f"/projects/{project.slug}/reliability/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    alerts = client.get(f"/projects/{project.slug}/alerts/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()

    assert "信頼性" in reliability and "失われた作業" in reliability
    assert "チャネルはまだありません" in alerts


def _crashed_run(project, creator, *, heartbeat_h, write_h, checkpoint_h, reaped_h=2.0):
    """A crashed Run started at T0 whose last heartbeat and write were ``heartbeat_h`` / ``write_h`` hours in (None:
    never), with one complete checkpoint created ``checkpoint_h`` hours in and ended by the reaper at ``reaped_h``."""
    at = lambda hours: None if hours is None else history.T0 + hours * history.H  # noqa: E731
    run = Run.objects.create(project=project, created_by=creator, name="lost", status=RunStatus.CRASHED)
    Run.objects.filter(pk=run.pk).update(
        created_at=history.T0,
        started_at=history.T0,
        ended_at=at(reaped_h),
        heartbeat_at=at(heartbeat_h),
        last_write_at=at(write_h),
    )
    saved = Checkpoint.objects.create(run=run, step=100, state=CheckpointState.COMPLETE)
    Checkpoint.objects.filter(pk=saved.pk).update(created_at=at(checkpoint_h), completed_at=at(checkpoint_h))
    return run


@pytest.mark.parametrize(
    ("heartbeat_h", "write_h", "lost_s", "hours_run"),
    [(1.5, 1.25, 1800, 1.5), (1.25, 1.75, 2700, 1.75), (None, None, 3600, 2.0)],
    ids=["heartbeat-later", "write-later", "neither-so-the-end"],
)
def test_lost_work_ends_at_the_last_sign_of_life_not_the_reapers_pass(
    api, project, creator, viewer, heartbeat_h, write_h, lost_s, hours_run
):
    run = _crashed_run(project, creator, heartbeat_h=heartbeat_h, write_h=write_h, checkpoint_h=1.0)

    body = api(viewer).get(f"/api/v1/projects/{project.slug}/reliability/").json()

    [lost] = body["ledger"]
    assert lost["run_id"] == run.pk and lost["lost_work_s"] == lost_s
    assert lost["last_checkpoint_at"] == (history.T0 + history.H).isoformat()
    assert body["hours_run"] == hours_run


def test_a_crash_then_a_resume_by_id_is_still_a_failure(api, project, creator, viewer):
    now = timezone.now()
    run = RunFactory(project=project, created_by=creator, name="again", status=RunStatus.RUNNING)
    Run.objects.filter(pk=run.pk).update(started_at=now - 3 * history.H, heartbeat_at=now - history.H)
    saved = Checkpoint.objects.create(run=run, step=100, state=CheckpointState.COMPLETE)
    Checkpoint.objects.filter(pk=saved.pk).update(created_at=now - 2 * history.H, completed_at=now - 2 * history.H)

    assert runs_reap_crashed(now=now) == 1
    resumed = run_start(actor=creator, project=project, external_id=run.external_id, resume="allow").run
    assert resumed.status == RunStatus.RUNNING and resumed.resume_count == 1

    body = api(viewer).get(f"/api/v1/projects/{project.slug}/reliability/").json()

    assert body["failures"] == 1
    [lost] = body["ledger"]
    assert (lost["run_id"], lost["status"], lost["segment"]) == (run.pk, "crashed", 0)
    assert lost["lost_work_s"] == 3600  # its last heartbeat − the checkpoint's creation
    assert lost["last_alive_at"] == (now - history.H).isoformat()
    assert lost["resumed_at"] is not None  # linked to the segment that resumed it
    resumed_at = Failure.objects.get(run=run, segment=0).resumed_at
    assert lost["restart_s"] == pytest.approx((resumed_at - (now - history.H)).total_seconds(), abs=1e-3)
    assert body["hours_run"] == 2.0  # the crashed segment, start to last heartbeat


def test_thin_data_says_not_enough_failures_instead_of_an_interval(api, login, project, creator, viewer):
    _crashed_run(project, creator, heartbeat_h=1.5, write_h=None, checkpoint_h=1.0)

    body = api(viewer).get(f"/api/v1/projects/{project.slug}/reliability/").json()
    page = login(creator).get(f"/projects/{project.slug}/reliability/").content.decode()

    assert body["failures"] == 1 and body["advice"] == "not enough failures yet"
    assert all(c["young_daly_interval_s"] is None for c in body["codes"])
    assert {c["advice"] for c in body["codes"]} == {"not enough failures yet"}
    assert "not enough failures yet" in page and "every 0 s" not in page


def test_thin_data_says_so_in_japanese(client, project, creator):
    _crashed_run(project, creator, heartbeat_h=1.5, write_h=None, checkpoint_h=1.0)
    client.force_login(creator)
    client.cookies["django_language"] = "ja"

    page = client.get(f"/projects/{project.slug}/reliability/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()

    assert "障害の数がまだ足りません" in page
