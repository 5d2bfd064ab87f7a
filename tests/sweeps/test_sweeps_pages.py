"""Sweep pages (docs/design/sweeps.md#sweeps, #requeue; docs/design/interfaces.md#surfaces): list, "New sweep" form,
Sweep page with trials, best trial and scatter plots."""

import json
import re

import pytest
from django.urls import reverse

from runs.models import RunStatus
from runs.services import run_set_status
from sweeps.models import Sweep, SweepTrial
from sweeps.services import sweep_claim, sweep_trial_retry
from tests.sweeps.sweep_helpers import RANDOM, log_metric, make_sweep, start_program

pytestmark = pytest.mark.django_db


def scatter_data(body: str) -> dict:
    """The scatter plots' JSON payload (``json_script`` "scatter-data") of a Sweep page ``body``."""
    return json.loads(
        re.search(r'<script id="scatter-data" type="application/json">(.*?)</script>', body, re.S).group(1)
    )


@pytest.fixture
def grid(project, member):
    return make_sweep(actor=member, project=project)


@pytest.fixture
def scored(grid, member):
    """Trials 1–3 of the grid: 1 finished (val_loss 0.5), 2 preempted and requeued (0.2), 3 claimed (none)."""
    trials = [sweep_claim(actor=member, sweep=grid, agent=f"gpu:{i}").trial for i in range(3)]
    for trial, values, status in (
        (trials[0], [0.9, 0.5], RunStatus.FINISHED),
        (trials[1], [0.7, 0.2], RunStatus.PREEMPTED),
    ):
        run = start_program(actor=member, trial=trial)
        log_metric(actor=member, run=run, key="val_loss", values=values)
        run_set_status(actor=member, run=run, status=status)
    return grid


def test_the_project_page_links_to_its_sweeps(login, viewer, project):
    body = login(viewer).get(reverse("runs:project-detail", args=["vision"])).content.decode()
    assert reverse("runs:sweep-list", args=["vision"]) in body and ">Sweeps<" in body


def test_the_list_shows_sweeps_and_the_new_button_to_members(login, grid, member, viewer, outsider):
    body = login(member).get(reverse("runs:sweep-list", args=["vision"])).content.decode()
    assert "digits" in body and reverse("runs:sweep-detail", args=[grid.pk]) in body
    assert reverse("runs:sweep-create", args=["vision"]) in body
    body = login(viewer).get(reverse("runs:sweep-list", args=["vision"])).content.decode()
    assert reverse("runs:sweep-create", args=["vision"]) not in body
    assert "viewers can only read" in body
    assert login(outsider).get(reverse("runs:sweep-list", args=["vision"])).status_code == 404


def test_the_create_form_makes_a_sweep_from_yaml(login, project, member):
    client = login(member)
    page = client.get(reverse("runs:sweep-create", args=["vision"]))
    assert page.status_code == 200 and "method: bayes" in page.content.decode()
    config = "method: grid\nmetric: {name: loss}\nparameters: {lr: {values: [0.1, 0.2]}}\nprogram: python t.py\n"
    response = client.post(reverse("runs:sweep-create", args=["vision"]), {"config": config})
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("runs:sweep-detail", args=[sweep.pk])
    assert (sweep.method, sweep.run_cap, sweep.created_by) == ("grid", 2, member)
    assert f"mado agent {sweep.pk}" in client.get(response["Location"]).content.decode()


def test_a_bad_config_is_shown_on_the_form_naming_the_field(login, project, member):
    config = "method: grid\nmetric: {name: loss}\nparameters: {}\nprogram: python t.py\n"
    response = login(member).post(reverse("runs:sweep-create", args=["vision"]), {"config": config})
    assert response.status_code == 400
    assert "parameters: parameters must be a non-empty mapping" in response.content.decode()
    assert "parameters: {}" in response.content.decode()  # what the user typed stays in the textarea
    assert not Sweep.objects.exists()


def test_viewers_and_outsiders_cannot_create(login, project, viewer, outsider):
    assert login(viewer).post(reverse("runs:sweep-create", args=["vision"]), {"config": "x"}).status_code == 403
    assert "viewers can only read" in login(viewer).get(reverse("runs:sweep-create", args=["vision"])).content.decode()
    assert login(outsider).get(reverse("runs:sweep-create", args=["vision"])).status_code == 404


def test_the_sweep_page_shows_trials_best_and_scatter(login, scored, viewer):
    response = login(viewer).get(reverse("runs:sweep-detail", args=[scored.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    rows = {int(n): row for n, row in re.findall(r'<tr data-trial="(\d+)"[^>]*>(.*?)</tr>', body, re.S)}
    assert sorted(rows) == [1, 2, 3]
    assert "0.5" in rows[1] and 'data-state="done"' in rows[1]
    assert "0.2" in rows[2] and 'data-state="queued"' in rows[2] and '<td class="num requeues">1</td>' in rows[2]
    assert 'data-state="leased"' in rows[3] and "gpu:2" in rows[3]
    trial2 = SweepTrial.objects.get(number=2)
    assert reverse("runs:run-detail", args=[trial2.run_id]) in rows[2]
    # Trial 2's 0.2 is lower but partial (preempted): the best is the finished trial 1.
    assert '<tr data-trial="1" class="best">' in body
    best = re.search(r'<section class="card best-trial" data-trial="(\d+)">', body)
    assert best.group(1) == "1"
    figures = re.findall(r'<figure class="metric-chart sweep-scatter" data-parameter="([^"]+)">', body)
    assert figures == ["hidden", "lr"]  # epochs is fixed: not plotted
    data = scatter_data(body)
    assert data["metric"] == "val_loss" and [s["parameter"] for s in data["scatters"]] == figures
    assert "<svg" not in body and "<circle" not in body  # uPlot draws them (static/scatter.js)
    for scatter in data["scatters"]:
        points = {p["trial"]: p for p in scatter["points"]}
        assert sorted(points) == [1, 2]  # trial 3 logged nothing
        assert (points[1]["kind"], points[1]["y"]) == ("best", 0.5)
        assert (points[2]["kind"], points[2]["y"]) == ("partial", 0.2)  # drawn hollow: its value is partial
        assert points[2]["label"].endswith("(partial: the run is preempted)")
    lr = data["scatters"][1]
    assert (lr["categories"], lr["log"], lr["domain"]) == (None, False, [0.01, 0.1])  # the searched values
    assert {p["trial"]: p["x"] for p in lr["points"]} == {1: 0.1, 2: 0.01}
    assert lr["points"][0]["label"] == "Trial 1: lr = 0.1, val_loss 0.5"
    assert "3 trials: 1 done, 0 running, 1 queued, 1 claimed" in body


def test_a_range_parameter_is_plotted_on_a_numeric_axis(login, project, member):
    sweep = make_sweep(actor=member, project=project, base=RANDOM)
    for _ in range(2):
        trial = sweep_claim(actor=member, sweep=sweep, agent="a").trial
        log_metric(actor=member, run=start_program(actor=member, trial=trial), key="acc", values=[0.5])
    body = login(member).get(reverse("runs:sweep-detail", args=[sweep.pk])).content.decode()
    assert body.count('data-parameter="') == 4
    scatters = {scatter["parameter"]: scatter for scatter in scatter_data(body)["scatters"]}
    # A numeric axis spans the searched range, whatever the two trials drew; lr is searched on a log scale.
    assert (scatters["lr"]["log"], scatters["lr"]["domain"]) == (True, [0.0001, 0.1])
    assert (scatters["hidden"]["log"], scatters["hidden"]["domain"][0], scatters["hidden"]["domain"][1]) == (
        False,
        8,
        128,
    )
    # Listed non-numeric values: one labelled slot each, x = the slot's index.
    assert scatters["optimizer"]["categories"] == ["adam", "sgd"]
    assert {p["x"] for p in scatters["optimizer"]["points"]} <= {0, 1}


def test_a_failed_trial_shows_failed_not_done(login, grid, member, viewer):
    trial = sweep_claim(actor=member, sweep=grid, agent="gpu:0").trial
    run = start_program(actor=member, trial=trial)
    run_set_status(actor=member, run=run, status=RunStatus.FAILED)
    body = login(viewer).get(reverse("runs:sweep-detail", args=[grid.pk])).content.decode()
    badge = re.search(r'<span class="badge trial-state state-done status-failed" data-state="done"[^>]*>([^<]*)<', body)
    assert badge and badge.group(1) == "failed"


def test_a_failed_trial_offers_its_retry_command_and_a_retried_one_links_its_earlier_run(login, grid, member, viewer):
    trial = sweep_claim(actor=member, sweep=grid, agent="gpu:0").trial
    failed = start_program(actor=member, trial=trial)
    run_set_status(actor=member, run=failed, status=RunStatus.FAILED)
    body = login(viewer).get(reverse("runs:sweep-detail", args=[grid.pk])).content.decode()
    assert f"<code>mado sweep retry {grid.pk} 1</code>" in body
    sweep_trial_retry(actor=member, trial=trial)
    body = login(viewer).get(reverse("runs:sweep-detail", args=[grid.pk])).content.decode()
    row = re.search(r'<tr data-trial="1"[^>]*>(.*?)</tr>', body, re.S).group(1)
    assert "mado sweep retry" not in row and 'data-state="queued"' in row
    assert re.search(rf'Earlier attempts: <a href="/runs/{failed.pk}/">{failed.external_id}</a>', row)


def test_an_empty_sweep_says_how_to_start_agents(login, grid, viewer):
    body = login(viewer).get(reverse("runs:sweep-detail", args=[grid.pk])).content.decode()
    assert f"mado agent {grid.pk}" in body and "No trial has logged val_loss yet." in body
    assert [scatter["points"] for scatter in scatter_data(body)["scatters"]] == [[], []]


def test_the_sweep_page_is_404_for_outsiders(login, grid, outsider):
    assert login(outsider).get(reverse("runs:sweep-detail", args=[grid.pk])).status_code == 404


def test_the_sweep_pages_are_translated_into_japanese(login, scored, viewer):
    client = login(viewer)
    client.post(reverse("set_language"), {"language": "ja", "next": "/"})
    body = client.get(reverse("runs:sweep-detail", args=[scored.pk])).content.decode()
    assert "最良のトライアル" in body and "トライアル" in body and "キュー待ち" in body
    body = client.get(reverse("runs:sweep-list", args=["vision"])).content.decode()
    assert "スイープ" in body
