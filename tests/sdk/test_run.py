"""start_run / Run against the real API on a live server (docs/design/resume.md#steps-continue;
docs/design/interfaces.md#surfaces)."""

import math
import os
import subprocess
import sys

import pytest

import mado_tracking
from mado_tracking import ConfigError, MadoError
from runs.models import MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _points(run_id: int, key: str) -> list[tuple[int, float | None]]:
    rows = MetricPoint.objects.filter(run_id=run_id, key=key).order_by("step", "id")
    return list(rows.values_list("step", "value"))


def test_start_run_creates_a_run_with_its_parameters(mmt_env, member, project):
    with mado_tracking.start_run(name="baseline", parameters={"lr": 0.1, "layers": [64, 10]}) as run:
        stored = Run.objects.get(pk=run.id)
        assert stored.status == RunStatus.RUNNING
    assert stored.project == project
    assert stored.created_by == member
    assert stored.name == "baseline"
    assert stored.kind == "training"
    assert stored.parameters == {"lr": 0.1, "layers": [64, 10]}
    assert stored.external_id == run.external_id
    assert run.project == "vision"
    assert run.url.startswith(mmt_env["MMT_API_URL"]) and str(run.id) in run.url


def test_arguments_win_over_the_environment(monkeypatch, live_server, member, project, other_project, token_of):
    monkeypatch.setenv("MMT_API_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("MMT_PROJECT", "other")
    with mado_tracking.start_run(
        "vision", kind="evaluation", api_url=live_server.url + "/api/v1/", api_token=token_of(member)
    ) as run:
        pass
    assert Run.objects.get(pk=run.id).kind == "evaluation"
    assert run.project == "vision"


def test_logged_points_are_stored_with_their_steps_and_values_after_the_block(mmt_env):
    with mado_tracking.start_run() as run:
        for step in range(3):
            run.log_metrics({"train.loss": 1.0 / (step + 1), "train.accuracy": step}, step=step)
        run.log_metrics({"train.loss": math.nan, "grad.norm": math.inf}, step=3)
        run.log_metrics({"grad.norm": -math.inf}, step=4)
    assert _points(run.id, "train.loss") == [(0, 1.0), (1, 0.5), (2, 1.0 / 3), (3, None)]  # NULL stores NaN
    assert _points(run.id, "train.accuracy") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert _points(run.id, "grad.norm") == [(3, math.inf), (4, -math.inf)]


def test_many_points_arrive_in_several_batches(mmt_env):
    with mado_tracking.start_run() as run:
        for step in range(12_345):
            run.log_metrics({"loss": float(step)}, step=step)
    assert MetricPoint.objects.filter(run_id=run.id).count() == 12_345
    assert _points(run.id, "loss")[-1] == (12_344, 12_344.0)


def test_leaving_the_block_normally_marks_the_run_finished(mmt_env):
    with mado_tracking.start_run() as run:
        pass
    stored = Run.objects.get(pk=run.id)
    assert stored.status == RunStatus.FINISHED and stored.ended_at is not None
    assert run.status == "finished"


def test_an_exception_in_the_block_marks_the_run_failed_and_is_reraised(mmt_env):
    with pytest.raises(ZeroDivisionError):
        with mado_tracking.start_run() as run:
            run.log_metrics({"loss": 1.0}, step=0)
            _ = 1 / 0
    assert Run.objects.get(pk=run.id).status == RunStatus.FAILED
    assert _points(run.id, "loss") == [(0, 1.0)]


def test_ctrl_c_in_the_block_marks_the_run_failed(mmt_env):
    with pytest.raises(KeyboardInterrupt):
        with mado_tracking.start_run() as run:
            raise KeyboardInterrupt
    assert Run.objects.get(pk=run.id).status == RunStatus.FAILED


def test_without_with_finish_sets_the_status_once(mmt_env):
    run = mado_tracking.start_run()
    run.log_metrics({"loss": 2.0}, step=7)
    run.finish(status="failed")
    run.finish()  # already finished: nothing happens
    assert Run.objects.get(pk=run.id).status == RunStatus.FAILED
    assert _points(run.id, "loss") == [(7, 2.0)]
    with pytest.raises(MadoError, match="finished"):
        run.log_metrics({"loss": 1.0}, step=8)


def test_a_run_aborted_on_the_server_meanwhile_keeps_that_state(mmt_env):
    with mado_tracking.start_run() as run:
        Run.objects.filter(pk=run.id).update(status=RunStatus.ABORTED)
    assert Run.objects.get(pk=run.id).status == RunStatus.ABORTED
    assert run.status == "aborted"


@pytest.mark.parametrize(
    ("missing", "named"),
    [("MMT_API_URL", "MMT_API_URL"), ("MMT_API_TOKEN", "MMT_API_TOKEN"), ("MMT_PROJECT", "MMT_PROJECT")],
)
def test_missing_configuration_is_a_clear_error_naming_the_setting(monkeypatch, missing, named):
    values = {"MMT_API_URL": "http://127.0.0.1:9", "MMT_API_TOKEN": "t", "MMT_PROJECT": "vision"}
    for name, value in values.items():
        if name != missing:
            monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=named):
        mado_tracking.start_run()


def test_a_malformed_api_url_is_a_config_error():
    with pytest.raises(ConfigError, match="http://host:8000"):
        mado_tracking.start_run("vision", api_url="localhost:8000", api_token="t")


def test_numpy_scalars_are_numbers(mmt_env):
    np = pytest.importorskip("numpy")
    with mado_tracking.start_run() as run:
        run.log_metrics({"loss": np.float32(0.25), "correct": np.int64(3)}, step=np.int64(2))
    assert _points(run.id, "loss") == [(2, 0.25)]
    assert _points(run.id, "correct") == [(2, 3.0)]


def test_bad_kind_or_parameters_are_refused_before_any_request(mmt_env):
    with pytest.raises(ValueError, match="kind"):
        mado_tracking.start_run(kind="pretraining")
    with pytest.raises(ValueError, match="parameters"):
        mado_tracking.start_run(parameters={"lr": math.nan})
    with pytest.raises(ValueError, match="parameters"):
        mado_tracking.start_run(parameters=[("lr", 0.1)])
    assert not Run.objects.exists()


def test_a_viewer_cannot_start_a_run(monkeypatch, live_server, viewer, token_of):
    with pytest.raises(mado_tracking.ApiError) as caught:
        mado_tracking.start_run("vision", api_url=live_server.url, api_token=token_of(viewer))
    assert caught.value.status == 403


@pytest.mark.parametrize("slug", ["vision", "nlp"])
def test_another_projects_slug_or_an_unknown_one_is_not_found_naming_it(live_server, outsider, project, token_of, slug):
    """An outsider learns nothing: another user's Project and none at all get the same answer, the slug asked for."""
    with pytest.raises(mado_tracking.ApiError) as caught:
        mado_tracking.start_run(slug, api_url=live_server.url, api_token=token_of(outsider))
    assert (caught.value.status, caught.value.field) == (404, "project")
    assert str(caught.value) == (
        f"no project '{slug}' among your projects: create it (POST /api/v1/projects/ with its name and slug) or "
        "ask its admin to add you (project= / MMT_PROJECT)"
    )
    assert not Run.objects.exists()


def test_a_wrong_token_is_named_in_one_clean_sentence(live_server):
    with pytest.raises(mado_tracking.ApiError) as caught:
        mado_tracking.start_run("vision", api_url=live_server.url, api_token="not-a-token")
    assert caught.value.status == 401
    assert str(caught.value).endswith(": Invalid token; check MMT_API_TOKEN")


@pytest.mark.parametrize(
    ("ending", "status"),
    [
        ("pass", RunStatus.FINISHED),
        ("raise RuntimeError('diverged')", RunStatus.FAILED),
        ("sys.exit(1)", RunStatus.FAILED),
        ("sys.exit('diverged at step 3')", RunStatus.FAILED),
        ("sys.exit(0)", RunStatus.FINISHED),
        ("sys.exit()", RunStatus.FINISHED),
    ],
)
def test_a_run_left_open_is_finished_at_interpreter_exit(mmt_env, ending, status):
    script = (
        "import sys, mado_tracking\n"
        "run = mado_tracking.start_run(name='open')\n"
        "run.log_metrics({'loss': 1.5}, step=3)\n"
        f"{ending}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, **mmt_env}, capture_output=True, text=True, timeout=60
    )
    run = Run.objects.get(name="open")
    assert run.status == status, done.stderr
    assert _points(run.pk, "loss") == [(3, 1.5)]


@pytest.mark.parametrize(("code", "status"), [(1, RunStatus.FAILED), (0, RunStatus.FINISHED)])
def test_sys_exit_of_main_that_started_the_run_is_seen(mmt_env, code, status):
    """``sys.exit(main())`` looks ``sys.exit`` up before ``main()`` starts the Run (and wraps it)."""
    script = (
        "import sys, mado_tracking\n"
        "def main():\n"
        "    run = mado_tracking.start_run(name='main')\n"
        "    run.log_metrics({'loss': 1.5}, step=3)\n"
        f"    return {code}\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, **mmt_env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == code and Run.objects.get(name="main").status == status, done.stderr


def test_a_jobs_code_attaches_to_its_pre_created_pending_run_through_mmt_run_id(mmt_env, monkeypatch, member, project):
    from tests.factories import RunFactory

    pending = RunFactory(
        project=project, created_by=member, status=RunStatus.PENDING, external_id="job-run-1", name="queued by a job"
    )
    monkeypatch.setenv("MMT_RUN_ID", "job-run-1")
    with mado_tracking.start_run(name="ignored") as run:
        run.log_metrics({"loss": 1.0}, step=0)
    assert run.id == pending.pk and run.external_id == "job-run-1"
    stored = Run.objects.get(pk=pending.pk)
    assert (stored.status, stored.name) == (RunStatus.FINISHED, "queued by a job")
    assert Run.objects.count() == 1 and _points(pending.pk, "loss") == [(0, 1.0)]
