"""The lost-work ledger and the checkpoint interval it recommends equal a hand computation
(docs/design/alerts.md#reliability)."""

import pytest

from tests.alerts import history

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
