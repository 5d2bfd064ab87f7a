"""The Run page shows resume, writer, heartbeat, dropped points, parameter changes and the sweep trial."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from runs.models import ParameterChange, Run
from sweeps.models import Sweep, SweepTrial


@pytest.fixture
def resumed_run(run, creator):
    """``run`` after two resumes on host gpu-7, with 12 points dropped below step 101 and one parameter changed."""
    since = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk=run.pk).update(
        resume_count=2,
        writer_host="gpu-7",
        writer_pid=4242,
        writer_since=since,
        heartbeat_at=since,
        step_floor=101,
        dropped_points=12,
        lease_token=3,
        started_at=since,
    )
    ParameterChange.objects.create(run=run, key="lr", old_value=0.1, new_value=0.05, lease_token=3, changed_by=creator)
    run.refresh_from_db()
    return run


def page(client, run) -> str:
    response = client.get(reverse("runs:run-detail", args=[run.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_run_page_shows_resume_writer_heartbeat_and_dropped_points(login, viewer, resumed_run):
    html = page(login(viewer), resumed_run)
    assert '<dd class="resume-count">2 times</dd>' in html
    assert "gpu-7 (pid 4242) since " + resumed_run.writer_since.strftime("%Y-%m-%d") in html
    assert f'<time datetime="{resumed_run.heartbeat_at.isoformat()}"' in html
    assert "12 points dropped: their step was below 101 after a resume." in html


def test_the_run_page_lists_parameter_changes(login, viewer, resumed_run):
    html = page(login(viewer), resumed_run)
    assert 'class="table compact parameter-changes"' in html
    assert "<td><code>0.1</code></td><td><code>0.05</code></td><td>carol-creator</td>" in html


def test_a_run_never_resumed_shows_no_dropped_points_or_changes(login, viewer, run):
    html = page(login(viewer), run)
    assert "resume-count" not in html and "Resumed under this id" not in html  # not "Resumes 0"
    assert "points dropped" not in html and "parameter-changes" not in html and "sweep-trial" not in html


def test_a_trials_run_links_to_its_sweep_and_names_the_trial(login, viewer, resumed_run, project, creator):
    sweep = Sweep.objects.create(
        project=project,
        name="lr-search",
        method="grid",
        parameters={"lr": {"values": [0.1, 0.05]}},
        metric_name="loss",
        program=["python", "train.py"],
        created_by=creator,
    )
    SweepTrial.objects.create(sweep=sweep, number=3, run=resumed_run, parameters={"lr": 0.05})
    html = page(login(viewer), resumed_run)
    assert f'<a href="{reverse("runs:sweep-detail", args=[sweep.pk])}">lr-search</a> · trial 3' in html


def test_the_new_facts_are_translated_to_japanese(login, viewer, resumed_run):
    client = login(viewer)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    html = page(client, resumed_run)
    assert "同じ id での再開" in html and "2 回" in html and "パラメータの変更" in html
    assert "12 点を破棄しました: 再開後のstepが 101 未満でした。" in html
