"""``/api/v1/sweeps/``: create, read, claim and report, with the roles' answers (docs/design/sweeps.md#sweeps, #requeue;
docs/api.md)."""

import pytest

from checkpoints.models import Checkpoint, CheckpointState
from runs.models import RunStatus
from runs.services import run_set_status
from sweeps.models import SweepTrial, TrialState
from tests.factories import run_token
from tests.sweeps.sweep_helpers import GRID, log_metric, make_sweep, start_program

pytestmark = pytest.mark.django_db

YAML = """
method: grid
metric: {name: val_loss, goal: minimize}
parameters:
  lr: {values: [0.1, 0.01]}
program: python train.py
"""


@pytest.fixture
def grid(project, member):
    return make_sweep(actor=member, project=project)


def claim(client, sweep, agent="gpu-1:100"):
    return client.post(f"/api/v1/sweeps/{sweep.pk}/claim/", {"agent": agent}, format="json")


def test_a_member_creates_a_sweep_from_yaml_text(api, project, member):
    response = api(member).post("/api/v1/sweeps/", {"project": "vision", "config": YAML}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["project"], body["method"], body["metric_name"], body["metric_goal"]) == (
        "vision",
        "grid",
        "val_loss",
        "minimize",
    )
    assert body["program"] == ["python", "train.py"]
    assert body["run_cap"] == 2 and body["parameters"] == {"lr": {"values": [0.1, 0.01]}}
    assert body["trial_counts"] == {"queued": 0, "leased": 0, "running": 0, "done": 0, "total": 0}
    assert body["url"] == f"http://testserver/sweeps/{body['id']}/"
    assert body["created_by"] == "mike-member"


def test_a_sweep_config_may_be_a_json_object(api, project, admin):
    response = api(admin).post("/api/v1/sweeps/", {"project": "vision", "config": GRID}, format="json")
    assert response.status_code == 201
    assert response.json()["config"] == GRID


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"parameters": {}}, "parameters"),
        ({"method": "hyperband"}, "method"),
        ({"metric": {"goal": "minimize"}}, "metric.name"),
        ({"program": ""}, "program"),
        ({"run_cap": -1}, "run_cap"),
        ({"parameters": {"lr": {"values": []}}}, "parameters.lr.values"),
    ],
)
def test_a_bad_config_is_a_400_naming_the_field(api, project, member, changes, field):
    response = api(member).post("/api/v1/sweeps/", {"project": "vision", "config": {**GRID, **changes}}, format="json")
    assert response.status_code == 400
    assert (response.json()["error"], response.json()["field"]) == ("invalid", field)


def test_a_viewer_cannot_create_and_an_outsider_does_not_see_the_project(api, project, viewer, outsider):
    assert api(viewer).post("/api/v1/sweeps/", {"project": "vision", "config": GRID}, format="json").status_code == 403
    assert (
        api(outsider).post("/api/v1/sweeps/", {"project": "vision", "config": GRID}, format="json").status_code == 404
    )
    assert api(None).get("/api/v1/sweeps/").status_code == 401


def test_list_filters_by_project_and_hides_other_projects(api, grid, viewer, outsider):
    body = api(viewer).get("/api/v1/sweeps/?project=vision").json()
    assert [s["id"] for s in body["results"]] == [grid.pk]
    assert api(outsider).get("/api/v1/sweeps/").json()["results"] == []
    assert api(outsider).get(f"/api/v1/sweeps/{grid.pk}/").status_code == 404
    assert api(outsider).get("/api/v1/sweeps/?project=vision").status_code == 404


def test_claim_answers_the_trial_program_and_project(api, grid, member):
    response = claim(api(member), grid)
    assert response.status_code == 200
    body = response.json()
    trial = SweepTrial.objects.get()
    assert body["trial"]["number"] == 1
    assert body["trial"]["parameters"] == {"epochs": 3, "hidden": 32, "lr": 0.1}
    assert (body["trial"]["run_id"], body["trial"]["external_id"]) == (trial.run_id, trial.run.external_id)
    assert body["trial"]["requeue_count"] == 0 and body["trial"]["latest_checkpoint"] is None
    assert body["trial"]["lease_expires_at"]
    assert body["program"] == ["python", "examples/sweep_training.py", "--fast"]
    assert (body["project"], body["done"]) == ("vision", False)
    assert trial.agent == "gpu-1:100"


def test_claim_of_a_requeued_trial_names_its_latest_checkpoint(api, grid, member):
    claim(api(member), grid)
    trial = SweepTrial.objects.get()
    run = start_program(actor=member, trial=trial)
    checkpoint = Checkpoint.objects.create(run=run, step=40, state=CheckpointState.COMPLETE)
    run_set_status(actor=member, run=run, status=RunStatus.PREEMPTED)
    body = claim(api(member), grid, agent="gpu-2:7").json()
    assert body["trial"]["number"] == 1 and body["trial"]["requeue_count"] == 1
    assert body["trial"]["latest_checkpoint"] == {"id": checkpoint.pk, "step": 40}


def test_claims_end_with_done_once_every_trial_ended(api, project, member):
    sweep = make_sweep(actor=member, project=project, run_cap=1)
    client = api(member)
    claim(client, sweep)
    assert claim(client, sweep).json() | {"reason": ""} == {
        "trial": None,
        "program": sweep.program,
        "project": "vision",
        "done": False,
        "reason": "",
    }
    trial = SweepTrial.objects.get()
    response = client.post(f"/api/v1/sweeps/{sweep.pk}/trials/1/report/", {"exit_code": 0}, format="json")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["run_status"]) == ("done", "finished")
    assert response.json()["external_id"] == trial.run.external_id
    done = claim(client, sweep).json()
    assert (done["trial"], done["done"]) == (None, True)


def test_a_preempted_report_requeues_the_trial(api, grid, member):
    claim(api(member), grid)
    start_program(actor=member, trial=SweepTrial.objects.get())
    body = (
        api(member)
        .post(f"/api/v1/sweeps/{grid.pk}/trials/1/report/", {"exit_code": -15, "preempted": True}, format="json")
        .json()
    )
    assert (body["state"], body["run_status"], body["requeue_count"], body["agent"]) == ("queued", "preempted", 1, "")


def test_claim_and_report_need_member_or_admin(api, grid, member, viewer, outsider):
    assert claim(api(viewer), grid).status_code == 403
    assert claim(api(outsider), grid).status_code == 404
    claim(api(member), grid)
    url = f"/api/v1/sweeps/{grid.pk}/trials/1/report/"
    assert api(viewer).post(url, {"exit_code": 0}, format="json").status_code == 403
    assert api(outsider).post(url, {"exit_code": 0}, format="json").status_code == 404
    assert (
        api(member).post(f"/api/v1/sweeps/{grid.pk}/trials/9/report/", {"exit_code": 0}, format="json").status_code
        == 404
    )
    bad = api(member).post(url, {"exit_code": "zero"}, format="json")
    assert (bad.status_code, bad.json()["field"]) == (400, "exit_code")
    assert SweepTrial.objects.get().state == TrialState.LEASED


def test_the_programs_start_marks_the_trial_running(api, grid, member):
    body = claim(api(member), grid).json()
    response = api(member).post(
        "/api/v1/runs/",
        {"project": "vision", "external_id": body["trial"]["external_id"], "resume": "allow"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    trial = SweepTrial.objects.get()
    assert (trial.state, trial.lease_expires_at, trial.run.status) == (TrialState.RUNNING, None, RunStatus.RUNNING)


def test_detail_lists_trials_with_their_last_metric_and_the_best(api, grid, member, viewer):
    claim(api(member), grid)
    claim(api(member), grid)
    first, second = SweepTrial.objects.order_by("number")
    runs = [start_program(actor=member, trial=trial) for trial in (first, second)]
    log_metric(actor=member, run=runs[0], key="val_loss", values=[0.9, 0.5])
    log_metric(actor=member, run=runs[1], key="val_loss", values=[0.8, 0.3, 0.4])
    body = api(viewer).get(f"/api/v1/sweeps/{grid.pk}/").json()
    rows = [(t["number"], t["state"], t["run_status"], t["metric"]) for t in body["trials"]]
    assert rows == [(1, "running", "running", 0.5), (2, "running", "running", 0.4)]
    assert body["trials"][0]["parameters"] == first.parameters
    assert body["best_trial"] is None  # running trials' last values are partial results
    for run in runs:
        run_set_status(actor=member, run=run, status=RunStatus.FINISHED)
    assert api(viewer).get(f"/api/v1/sweeps/{grid.pk}/").json()["best_trial"] == 2
    assert body["trial_counts"]["running"] == 2 and body["trial_counts"]["total"] == 2


def test_a_run_token_cannot_use_sweeps(api, grid, run, creator):

    client = api(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {run_token(run, creator).key}")
    assert client.post(f"/api/v1/sweeps/{grid.pk}/claim/", {}, format="json").status_code == 403
    assert not SweepTrial.objects.exists()
