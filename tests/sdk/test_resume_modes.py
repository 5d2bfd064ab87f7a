"""start_run(id=..., resume=...) against the real API (docs/design/runs.md#resume-modes): the matrix, ``auto``, steps
and parameters."""

import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import mado_tracking
from mado_tracking import ApiError
from mado_tracking.resume_mode import create_run, start_body
from runs.models import MetricPoint, ParameterChange, Run, RunStatus, SegmentPoint
from runs.segments import bits_to_values
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)

RESUME_FILE = Path(".mado") / "resume.json"


def _points(run_id: int, key: str) -> list[tuple[int, float]]:
    return list(MetricPoint.objects.filter(run_id=run_id, key=key).order_by("step").values_list("step", "value"))


def _ended_run(external_id: str, *, status: str = "failed", steps: int = 3, **kwargs) -> Run:
    """A run started and ended through the SDK with ``loss`` logged at steps 0 .. steps - 1."""
    run = mado_tracking.start_run(id=external_id, **kwargs)
    for step in range(steps):
        run.log_metrics({"loss": float(step)})
    run.finish(status)
    return Run.objects.get(pk=run.id)


@pytest.mark.parametrize("mode", ["must", "allow"])
def test_must_and_allow_resume_a_stopped_run_and_continue_its_steps(mmt_env, mode):
    first = _ended_run("exp-42", parameters={"lr": 0.1})
    with mado_tracking.start_run(id="exp-42", resume=mode, parameters={"lr": 0.1}) as run:
        assert (run.id, run.resumed, run.step, run.resume_count) == (first.pk, True, 3, 1)
        assert run.fencing_token == first.lease_token + 1
        run.log_metrics({"loss": 30.0})
        run.log_metrics({"loss": 40.0})
    assert _points(first.pk, "loss") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert Run.objects.get(pk=first.pk).status == RunStatus.FINISHED


def test_must_with_an_unknown_id_names_the_project_searched(mmt_env, other_project, member):
    RunFactory(
        project=other_project,
        created_by=member,
        external_id="elsewhere",
        status=RunStatus.FAILED,
        started_at=timezone.now(),
    )
    with pytest.raises(ApiError) as caught:
        mado_tracking.start_run(id="elsewhere", resume="must")
    assert caught.value.status == 404
    assert str(caught.value) == (
        "run elsewhere not found in project vision (id= / MMT_RUN_ID); use resume='allow' to create it"
    )
    assert not Run.objects.filter(project__slug="vision").exists()


def test_allow_creates_a_new_run_under_the_id(mmt_env):
    with mado_tracking.start_run(id="fresh-1", resume="allow") as run:
        assert (run.external_id, run.resumed, run.step, run.fencing_token) == ("fresh-1", False, 0, 1)
    assert Run.objects.get(pk=run.id).external_id == "fresh-1"


def test_never_refuses_an_existing_id_and_creates_a_new_one(mmt_env):
    _ended_run("taken")
    with pytest.raises(ApiError) as caught:
        mado_tracking.start_run(id="taken", resume="never")
    assert (caught.value.status, caught.value.field) == (409, "external_id")
    with mado_tracking.start_run(id="new-one", resume="never") as run:
        assert not run.resumed
    assert Run.objects.count() == 2


def test_the_environment_gives_the_id_and_mode(mmt_env, monkeypatch):
    first = _ended_run("from-env")
    monkeypatch.setenv("MMT_RUN_ID", "from-env")
    monkeypatch.setenv("MMT_RESUME", "must")
    with mado_tracking.start_run() as run:
        assert (run.id, run.resumed) == (first.pk, True)


def test_a_sweep_trials_pending_run_is_attached_with_resume_allow(mmt_env, monkeypatch, member, project):
    pending = RunFactory(project=project, created_by=member, status=RunStatus.PENDING, external_id="trial-7")
    monkeypatch.setenv("MMT_RUN_ID", "trial-7")
    monkeypatch.setenv("MMT_RESUME", "allow")
    with mado_tracking.start_run() as run:
        assert (run.id, run.resumed, run.step, run.fencing_token) == (pending.pk, False, 0, 1)
    assert Run.objects.get(pk=pending.pk).status == RunStatus.FINISHED


@pytest.mark.parametrize(
    ("kwargs", "env", "named"),
    [
        ({"resume": "sometimes"}, {}, "resume"),
        ({}, {"MMT_RESUME": "sometimes"}, "MMT_RESUME"),
        ({"id": "has space"}, {}, "MMT_RUN_ID"),
        ({"id": "x" * 129}, {}, "MMT_RUN_ID"),
        ({}, {"MMT_RUN_ID": "a/b"}, "MMT_RUN_ID"),
        ({"resume": "must"}, {}, "MMT_RUN_ID"),
        ({"resume": "allow", "offline": True}, {}, "resume needs the mado server"),
        ({}, {"MMT_HEARTBEAT_INTERVAL": "soon"}, "MMT_HEARTBEAT_INTERVAL"),
        ({}, {"MMT_HEARTBEAT_INTERVAL": "0"}, "MMT_HEARTBEAT_INTERVAL"),
        ({}, {"MMT_LOG_LEVEL": "LOUD"}, "MMT_LOG_LEVEL"),
        ({"id": "x", "resume": "must"}, {"MMT_RESUME_CHECKPOINT_ID": "abc"}, "MMT_RESUME_CHECKPOINT_ID"),
        ({"id": "x", "resume": "must"}, {"MMT_RESUME_CHECKPOINT_ID": "0"}, "MMT_RESUME_CHECKPOINT_ID"),
    ],
)
def test_bad_ids_and_modes_are_refused_before_any_request(mmt_env, monkeypatch, kwargs, env, named):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=named):
        mado_tracking.start_run(**kwargs)
    assert not Run.objects.exists()
    assert not RESUME_FILE.exists()


def test_a_changed_parameter_is_refused_unless_allowed_and_recorded(mmt_env):
    first = _ended_run("params", parameters={"lr": 0.1})
    with pytest.raises(ApiError) as caught:
        mado_tracking.start_run(id="params", resume="allow", parameters={"lr": 0.2})
    assert (caught.value.status, caught.value.field) == (409, "parameters.lr")
    assert "allow_param_change=True" in str(caught.value)
    with mado_tracking.start_run(
        id="params", resume="allow", parameters={"lr": 0.2, "wd": 0.01}, allow_param_change=True
    ):
        pass
    assert Run.objects.get(pk=first.pk).parameters == {"lr": 0.2, "wd": 0.01}
    assert ParameterChange.objects.filter(run=first).count() == 1


def test_points_below_the_resumed_step_are_compared_not_added_to_the_curve_and_not_warned_as_dropped(mmt_env, caplog):
    first = _ended_run("drops", steps=5)
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        with mado_tracking.start_run(id="drops", resume="allow") as run:
            run.log_metrics({"loss": -1.0, "acc": 0.5}, step=2)
            run._sender.flush(10)
            run.log_metrics({"loss": -2.0}, step=3)
            run._sender.flush(10)
            assert run.step == 5  # an explicit lower step does not move the counter back
            run.log_metrics({"loss": 5.0})
    assert not [record for record in caplog.records if "dropped by the server" in record.getMessage()]
    assert _points(first.pk, "loss")[-1] == (5, 5.0) and _points(first.pk, "acc") == []
    assert Run.objects.get(pk=first.pk).dropped_points == 0
    kept = (
        SegmentPoint.objects.filter(segment__run=first).order_by("key", "step").values_list("key", "step", "value_bits")
    )
    values = bits_to_values([bits for _key, _step, bits in kept]).tolist()
    assert [(key, step, value) for (key, step, _bits), value in zip(kept, values)] == [
        ("acc", 2, 0.5),
        ("loss", 2, -1.0),
        ("loss", 3, -2.0),
    ]


def test_auto_resumes_the_unfinished_run_started_here_and_forgets_it_once_finished(mmt_env):
    with pytest.raises(RuntimeError):
        with mado_tracking.start_run(resume="auto") as first:
            first.log_metrics({"loss": 1.0})
            raise RuntimeError("diverged")
    record = json.loads(RESUME_FILE.read_text())
    assert (record["project"], record["run_id"]) == ("vision", first.external_id)

    with mado_tracking.start_run(resume="auto") as second:
        assert (second.external_id, second.resumed, second.step) == (first.external_id, True, 1)
    assert not RESUME_FILE.exists()  # a clean finish: nothing left to resume

    with mado_tracking.start_run(resume="auto") as third:
        assert not third.resumed and third.external_id != first.external_id
    assert Run.objects.get(pk=first.id).status == RunStatus.FINISHED


def test_auto_says_which_run_it_resumes_and_from_which_file(mmt_env, caplog):
    interrupted = _ended_run("experiment-a", parameters={"lr": 0.1})
    caplog.set_level(logging.INFO, logger="mado_tracking")
    with mado_tracking.start_run(resume="auto", parameters={"lr": 0.1}) as run:
        assert run.external_id == "experiment-a"
    line = next(r.getMessage() for r in caplog.records if "resume='auto'" in r.getMessage())
    assert "experiment-a" in line and str(Path.cwd() / RESUME_FILE) in line
    assert interrupted.pk == run.id


def test_a_parameter_conflict_under_auto_names_the_file_and_does_not_suggest_merging(mmt_env):
    _ended_run("experiment-a", parameters={"lr": 0.1})
    with pytest.raises(ApiError) as caught:
        mado_tracking.start_run(resume="auto", parameters={"lr": 0.5})
    message = str(caught.value)
    assert "experiment-a" in message and str(Path.cwd() / RESUME_FILE) in message
    assert "resume='never'" in message and "allow_param_change" not in message
    assert (caught.value.status, caught.value.field) == (409, "parameters.lr")
    assert Run.objects.get(external_id="experiment-a").parameters == {"lr": 0.1}


def test_auto_ignores_a_finished_run_and_another_projects_file(mmt_env, other_project):
    finished = _ended_run("done-run", status="finished")
    RESUME_FILE.parent.mkdir()
    for project in ("vision", "other"):
        RESUME_FILE.write_text(json.dumps({"project": project, "run_id": finished.external_id}))
        run = mado_tracking.start_run(resume="auto")
        assert not run.resumed and run.external_id != finished.external_id
        run.finish("failed")


def test_any_start_overwrites_the_file_and_auto_with_an_id_means_allow(mmt_env):
    _ended_run("older")
    assert json.loads(RESUME_FILE.read_text())["run_id"] == "older"
    with pytest.raises(RuntimeError):
        with mado_tracking.start_run(id="newer"):
            raise RuntimeError
    assert json.loads(RESUME_FILE.read_text())["run_id"] == "newer"
    with mado_tracking.start_run(id="older", resume="auto") as run:
        assert run.resumed and run.external_id == "older"
        assert json.loads(RESUME_FILE.read_text())["run_id"] == "older"
    assert not RESUME_FILE.exists()


def test_a_live_run_is_refused_naming_its_host(mmt_env):
    with mado_tracking.start_run(id="busy") as live:
        with pytest.raises(ApiError) as caught:
            mado_tracking.start_run(id="busy", resume="allow")
        assert (caught.value.status, caught.value.code) == (409, "run_live")
        assert "run busy is live on" in str(caught.value)
    Run.objects.filter(pk=live.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    with mado_tracking.start_run(id="busy", resume="must") as run:  # finished, so not live any more
        assert run.resumed


class _LostAnswerClient:
    """The first POST reached the server but its answer was lost; the retry meets the Run it made."""

    def __init__(self, found: dict, code: str):
        self.found, self.code = found, code

    def request(self, method, path, *, body=None, params=None, on_retry=None, **kwargs):
        if method == "POST":
            on_retry()
            raise ApiError("taken", status=409, code=self.code, field="external_id")
        return {"results": [self.found]}


@pytest.mark.parametrize("code", ["conflict", "run_live"])
def test_a_retried_start_returns_its_own_run_but_not_another_writers(code):
    body = start_body(
        project="vision",
        kind="training",
        parameters={},
        name=None,
        run_id="exp-1",
        resume="allow",
        allow_param_change=False,
    )
    own = {"external_id": "exp-1", "writer_host": body["host"], "writer_pid": body["pid"], "fencing_token": 3}
    assert create_run(_LostAnswerClient(own, code), body) == own
    other = {**own, "writer_pid": body["pid"] + 1}
    with pytest.raises(ApiError):
        create_run(_LostAnswerClient(other, code), body)
