"""POST runs/ by run id: the resume matrix, step continuation, parameter merge, single writer
(docs/design/runs.md#resume-modes, #one-writer-process)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints.models import Checkpoint, CheckpointState
from runs.metrics import metrics_ingest
from runs.models import MetricPoint, ParameterChange, Run, RunStatus
from tests.factories import RunFactory

URL = "/api/v1/runs/"


def start(client, run_id=None, resume=None, **extra):
    body = {"project": "vision", **extra}
    if run_id is not None:
        body["external_id"] = run_id
    if resume is not None:
        body["resume"] = resume
    return client.post(URL, body, format="json")


def stopped(project, creator, run_id="exp-42", status=RunStatus.FAILED, **fields):
    """A Run that was started and stopped (its writer gone)."""
    return RunFactory(
        project=project,
        created_by=creator,
        external_id=run_id,
        status=status,
        started_at=timezone.now() - timedelta(hours=1),
        **fields,
    )


def live(project, creator, run_id="exp-42", seconds_ago=5):
    """A running Run whose writer heartbeated ``seconds_ago``."""
    now = timezone.now()
    return RunFactory(
        project=project,
        created_by=creator,
        external_id=run_id,
        status=RunStatus.RUNNING,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(seconds=seconds_ago),
        writer_host="gpu-7",
        writer_pid=4242,
        writer_since=now - timedelta(hours=1),
        lease_token=3,
    )


# --- the matrix ----------------------------------------------------------------------------


@pytest.mark.parametrize("resume", ["must", "allow", "never", None])
def test_a_stopped_run_is_resumed_by_must_and_allow_and_refused_by_never_and_absent(api, project, creator, resume):
    run = stopped(project, creator)
    response = start(api(creator), "exp-42", resume)
    if resume in ("must", "allow"):
        assert response.status_code == 200, response.content
        body = response.json()
        assert (body["id"], body["status"], body["resumed"], body["resume_count"]) == (run.pk, "running", True, 1)
    else:
        assert response.status_code == 409
        assert response.json()["field"] == "external_id"
        assert "run exp-42 already exists in project vision" in response.json()["detail"]
        run.refresh_from_db()
        assert (run.status, run.resume_count) == (RunStatus.FAILED, 0)


@pytest.mark.parametrize("resume", ["allow", "never", None])
def test_an_absent_id_is_created_by_allow_never_and_absent(api, member, resume):
    response = start(api(member), "exp-42", resume)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["external_id"], body["status"], body["resumed"], body["fencing_token"]) == (
        "exp-42",
        "running",
        False,
        1,
    )
    assert (body["last_step"], body["step_floor"], body["resume_count"]) == (None, 0, 0)


def test_must_on_an_absent_id_is_404_naming_the_project(api, member):
    response = start(api(member), "exp-42", "must")
    assert response.status_code == 404
    assert response.json()["field"] == "external_id"
    assert response.json()["detail"] == "run exp-42 not found in project vision"
    assert not Run.objects.filter(external_id="exp-42").exists()


def test_must_on_an_id_of_another_project_is_404_naming_the_project_searched(
    api, project, member, other_project, outsider
):
    stopped(other_project, outsider, run_id="theirs-1")
    response = start(api(member), "theirs-1", "must")
    assert response.status_code == 404
    assert response.json()["detail"] == "run theirs-1 not found in project vision"


def test_allow_on_an_id_of_another_project_creates_one_here(api, project, member, other_project, outsider):
    theirs = stopped(other_project, outsider, run_id="shared-id")
    response = start(api(member), "shared-id", "allow")
    assert response.status_code == 201
    assert response.json()["id"] != theirs.pk and response.json()["project"] == "vision"


@pytest.mark.parametrize("resume", ["allow", "never", None])
def test_a_pending_run_is_attached_by_its_creator(api, project, creator, resume):
    pending = RunFactory(
        project=project, created_by=creator, external_id="trial-3", status=RunStatus.PENDING, parameters={"lr": 0.1}
    )
    response = start(api(creator), "trial-3", resume, parameters={"lr": 0.5}, host="node-1", pid=77)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["status"], body["resumed"], body["parameters"]) == (
        pending.pk,
        "running",
        False,
        {"lr": 0.1},
    )
    assert (body["fencing_token"], body["writer_host"], body["writer_pid"]) == (1, "node-1", 77)
    assert body["heartbeat_at"] and body["last_step"] is None


def test_attaching_fills_the_name_and_parameters_the_job_left_open(api, project, creator):
    pending = RunFactory(
        project=project,
        created_by=creator,
        external_id="job-run",
        status=RunStatus.PENDING,
        name="",
        parameters={"lr": 0.1},
    )
    response = start(api(creator), "job-run", None, name="resnet50", parameters={"lr": 0.5, "epochs": 3})
    assert response.status_code == 200, response.content
    assert (response.json()["name"], response.json()["parameters"]) == ("resnet50", {"lr": 0.1, "epochs": 3})
    pending.refresh_from_db()
    assert (pending.name, pending.parameters) == ("resnet50", {"lr": 0.1, "epochs": 3})
    named = RunFactory(
        project=project, created_by=creator, external_id="named", status=RunStatus.PENDING, name="from the job"
    )
    assert start(api(creator), "named", None, name="from code").json()["name"] == "from the job"
    named.refresh_from_db()
    assert named.name == "from the job"


def test_must_on_a_pending_never_started_run_is_404(api, project, creator):
    RunFactory(project=project, created_by=creator, external_id="trial-3", status=RunStatus.PENDING)
    response = start(api(creator), "trial-3", "must")
    assert response.status_code == 404 and "never started" in response.json()["detail"]
    assert Run.objects.get(external_id="trial-3").status == RunStatus.PENDING


def test_another_users_pending_run_is_not_attached(api, project, creator, member):
    RunFactory(project=project, created_by=creator, external_id="trial-3", status=RunStatus.PENDING)
    response = start(api(member), "trial-3", "allow")
    assert response.status_code == 409 and response.json()["field"] == "external_id"
    assert Run.objects.get(external_id="trial-3").status == RunStatus.PENDING


@pytest.mark.parametrize("status", [RunStatus.FINISHED, RunStatus.CRASHED, RunStatus.PREEMPTED, RunStatus.ABORTED])
def test_allow_resumes_a_run_in_any_final_state(api, project, creator, status):
    run = stopped(project, creator, status=status)
    run.ended_at = timezone.now()
    run.save()
    response = start(api(creator), "exp-42", "allow")
    assert response.status_code == 200
    run.refresh_from_db()
    assert (run.status, run.ended_at, run.resume_count) == (RunStatus.RUNNING, None, 1)


def test_each_start_takes_a_new_fencing_token(api, project, creator):
    run = stopped(project, creator)
    tokens = []
    for _ in range(3):
        tokens.append(start(api(creator), "exp-42", "allow", host="h").json()["fencing_token"])
        Run.objects.filter(pk=run.pk).update(status=RunStatus.CRASHED)
    assert tokens == [1, 2, 3]
    assert Run.objects.get(pk=run.pk).resume_count == 3


def test_a_viewer_cannot_start_or_resume_and_an_outsider_gets_404(api, project, creator, viewer, outsider):
    stopped(project, creator)
    assert start(api(viewer), "exp-42", "allow").status_code == 403
    assert start(api(outsider), "exp-42", "allow").status_code == 404
    assert Run.objects.get(external_id="exp-42").status == RunStatus.FAILED


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("resume", ["auto", "yes", "MUST", 1])
def test_an_unknown_resume_mode_is_400_naming_resume(api, member, resume):
    response = start(api(member), "exp-42", resume)
    assert response.status_code == 400
    assert response.json()["field"] == "resume"
    assert response.json()["detail"] == "resume must be one of must, allow, never; auto is resolved by the SDK"
    assert not Run.objects.exists()


@pytest.mark.parametrize("run_id", ["has space", "slash/id", "ünïcode", "semi;colon", "a" * 129])
def test_a_bad_run_id_is_400_naming_external_id(api, member, run_id):
    response = start(api(member), run_id, "allow")
    assert response.status_code == 400
    assert response.json()["field"] == "external_id"
    assert response.json()["detail"] == "external_id must be 1 to 128 characters from A-Z, a-z, 0-9, '_', '.' and '-'"
    assert not Run.objects.exists()


def test_a_128_character_id_with_every_allowed_character_is_accepted(api, member):
    run_id = ("Az09_.-" * 20)[:128]
    assert start(api(member), run_id, "allow").status_code == 201


def test_must_without_an_id_is_400(api, member):
    response = start(api(member), None, "must")
    assert response.status_code == 400 and response.json()["field"] == "external_id"


# --- step continuation and dropping --------------------------------------------------------


def test_a_resume_continues_after_the_last_logged_step_and_keeps_lower_steps_out_of_the_series(api, project, creator):
    run = stopped(project, creator)
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": s} for s in range(50)])
    body = start(api(creator), "exp-42", "allow").json()
    assert (body["last_step"], body["step_floor"]) == (49, 50)

    client = api(creator)
    token = {"HTTP_MADO_FENCING_TOKEN": str(body["fencing_token"])}
    points = [
        {"key": "loss", "value": 0.5, "step": 48},
        {"key": "acc", "value": 0.1, "step": 10},
        {"key": "acc", "value": 0.2, "step": 11},
        {"key": "loss", "value": 0.4, "step": 50},
    ]
    response = client.post(f"{URL}{run.pk}/metrics/", {"points": points}, format="json", **token)
    assert response.status_code == 201
    assert response.json() == {"stored": 1, "compared": 3, "dropped": 0, "dropped_keys": []}
    assert sorted(MetricPoint.objects.filter(run=run, step__gte=48).values_list("step", flat=True)) == [48, 49, 50]
    assert MetricPoint.objects.get(run=run, step=48).value == 1.0, "the stored point is never overwritten"
    body = client.get(f"{URL}{run.pk}/").json()
    assert body["dropped_points"] == 0, "kept as the resumed segment's own points, compared with the series"
    assert [(s["number"], s["floor"]) for s in body["resume_segments"]] == [(1, 50)]


def test_an_idempotent_replay_of_a_dropped_batch_is_not_counted_twice(api, project, creator):
    run = stopped(project, creator, step_floor=10)
    client = api(creator)
    batch = {"points": [{"key": "loss", "value": 1.0, "step": 3}]}
    first = client.post(f"{URL}{run.pk}/metrics/", batch, format="json", HTTP_IDEMPOTENCY_KEY="b1")
    again = client.post(f"{URL}{run.pk}/metrics/", batch, format="json", HTTP_IDEMPOTENCY_KEY="b1")
    assert (first.status_code, first.json()) == (
        201,
        {"stored": 0, "compared": 0, "dropped": 1, "dropped_keys": ["loss"]},
    ), "a Run resumed before segments were kept has no segment: its points below the floor are dropped"
    assert (again.status_code, again.json()) == (200, {"stored": 0, "compared": 0, "dropped": 0, "dropped_keys": []})
    run.refresh_from_db()
    assert run.dropped_points == 1


def test_a_resume_from_a_checkpoint_continues_at_the_checkpoints_step(api, project, creator):
    run = stopped(project, creator)
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": s} for s in range(30)])
    Checkpoint.objects.create(run=run, step=30, state=CheckpointState.COMPLETE)
    body = start(api(creator), "exp-42", "allow").json()
    assert (body["last_step"], body["step_floor"]) == (29, 30), "a checkpoint at step 30 means 30 steps completed"


def test_a_checkpoint_beyond_the_last_metric_raises_the_floor(api, project, creator):
    run = stopped(project, creator)
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": 5}])
    Checkpoint.objects.create(run=run, step=40, state=CheckpointState.PENDING)
    assert start(api(creator), "exp-42", "allow").json()["step_floor"] == 40


def test_a_run_that_logged_the_largest_step_resumes_with_its_floor_there_twice(api, project, creator):
    run = stopped(project, creator)
    largest = 2**63 - 1
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": largest}])
    body = start(api(creator), "exp-42", "allow").json()
    assert (body["last_step"], body["step_floor"]) == (largest, largest), "the floor is a BIGINT: it stays at the top"
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CRASHED)
    assert start(api(creator), "exp-42", "allow").json()["resume_count"] == 2


def test_a_resume_of_a_run_with_no_steps_keeps_the_floor(api, project, creator):
    stopped(project, creator)
    body = start(api(creator), "exp-42", "allow").json()
    assert (body["last_step"], body["step_floor"]) == (None, 0)


def test_a_second_resume_continues_from_where_the_first_got_to(api, project, creator):
    run = stopped(project, creator)
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": 9}])
    assert start(api(creator), "exp-42", "allow").json()["step_floor"] == 10
    metrics_ingest(actor=creator, run=Run.objects.get(pk=run.pk), points=[{"key": "loss", "value": 1.0, "step": 19}])
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CRASHED)
    body = start(api(creator), "exp-42", "allow").json()
    assert (body["last_step"], body["step_floor"], body["resume_count"]) == (19, 20, 2)


# --- parameters -----------------------------------------------------------------------------


def test_a_resume_adds_new_parameters_and_keeps_equal_ones(api, project, creator):
    stopped(project, creator, parameters={"lr": 0.1, "layers": [64, 32]})
    response = start(api(creator), "exp-42", "allow", parameters={"lr": 0.1, "layers": [64, 32], "seed": 7})
    assert response.status_code == 200
    assert response.json()["parameters"] == {"lr": 0.1, "layers": [64, 32], "seed": 7}
    assert not ParameterChange.objects.exists()


def test_a_changed_parameter_is_refused_and_nothing_changes(api, project, creator):
    run = stopped(project, creator, parameters={"lr": 0.1})
    response = start(api(creator), "exp-42", "allow", parameters={"lr": 0.2, "seed": 7})
    assert response.status_code == 409
    assert response.json()["field"] == "parameters.lr"
    assert response.json()["detail"] == (
        "parameter lr is 0.1 in run exp-42; pass allow_param_change=True to change it to 0.2"
    )
    run.refresh_from_db()
    assert (run.parameters, run.status, run.lease_token, run.resume_count) == ({"lr": 0.1}, RunStatus.FAILED, 0, 0)


def test_allow_param_change_changes_the_value_and_records_the_change(api, project, creator, admin):
    run = stopped(project, creator, parameters={"lr": 0.1, "opt": "sgd"})
    response = start(api(admin), "exp-42", "allow", parameters={"lr": 0.2, "opt": "sgd"}, allow_param_change=True)
    assert response.status_code == 200
    assert response.json()["parameters"] == {"lr": 0.2, "opt": "sgd"}
    change = ParameterChange.objects.get(run=run)
    assert (change.key, change.old_value, change.new_value, change.lease_token, change.changed_by) == (
        "lr",
        0.1,
        0.2,
        1,
        admin,
    )


# --- single writer --------------------------------------------------------------------------


@pytest.mark.parametrize("resume", ["must", "allow"])
def test_a_run_with_a_fresh_heartbeat_is_live_and_cannot_be_resumed(api, project, creator, resume):
    run = live(project, creator, seconds_ago=12)
    response = start(api(creator), "exp-42", resume, host="other-host")
    assert response.status_code == 409
    body = response.json()
    assert (body["error"], body["field"]) == ("run_live", "external_id")
    assert body["detail"].startswith(f"run exp-42 is live on gpu-7 since {run.writer_since.isoformat()}")
    assert "(last heartbeat 12 s ago)" in body["detail"]
    run.refresh_from_db()
    assert (run.lease_token, run.writer_host, run.resume_count) == (3, "gpu-7", 0)


def test_a_preempting_run_with_a_fresh_heartbeat_is_live_too(api, project, creator):
    run = live(project, creator)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.PREEMPTING)
    assert start(api(creator), "exp-42", "allow").json()["error"] == "run_live"


def test_a_running_run_whose_heartbeat_is_stale_can_be_taken_over(api, project, creator, settings):
    settings.MMT_CRASH_TIMEOUT = 60
    run = live(project, creator, seconds_ago=61)
    response = start(api(creator), "exp-42", "allow", host="new-host", pid=9)
    assert response.status_code == 200
    body = response.json()
    assert (body["fencing_token"], body["writer_host"], body["writer_pid"], body["resumed"]) == (4, "new-host", 9, True)
    run.refresh_from_db()
    assert run.heartbeat_at > timezone.now() - timedelta(seconds=5)


def test_a_start_answers_the_heartbeat_interval_and_crash_timeout(api, member, settings):
    settings.MMT_HEARTBEAT_INTERVAL, settings.MMT_CRASH_TIMEOUT = 7, 90
    answer = start(api(member), "exp-42", "allow").json()
    assert (answer["heartbeat_interval"], answer["crash_timeout"]) == (7, 90)


def test_a_just_created_run_is_live_for_a_second_process(api, admin, creator):
    assert start(api(creator), "exp-42", "allow", host="a").status_code == 201
    response = start(api(admin), "exp-42", "allow", host="b")
    assert (response.status_code, response.json()["error"]) == (409, "run_live")
    assert "is live on a since" in response.json()["detail"]
