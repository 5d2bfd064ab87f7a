"""Sweep pages and a resumed Run's facts in a real browser
(docs/design/runs.md#resume-modes, #one-writer-process, #states; docs/design/sweeps.md#sweeps, #requeue).

A member opens the project's Sweeps from the project page, pastes a YAML
grid (lr × hidden, 4 trials) into "New sweep" and lands on the Sweep page; a
config with no parameters is refused on the form, naming the field, and
creates nothing. Trials are then claimed, started, logged and ended with the
services (what agents and programs do over the API), and the reloaded Sweep
page shows the trials table, the best trial and one scatter dot per trial
with a metric. A viewer reads the pages but cannot create. Last, the Run page
of a run resumed under its id shows the resume count, the writer, the
dropped points and the parameter change.
"""

import re

import pytest
from playwright.sync_api import expect

from runs import services as run_services
from runs.metrics import metrics_ingest
from runs.models import Role, RunStatus
from runs.resume import run_start
from sweeps.models import Sweep, SweepTrial
from sweeps.services import sweep_claim
from tests.e2e.helpers import log_in, screenshot
from tests.factories import MembershipFactory, ProjectFactory, UserFactory

GRID = """\
name: digits-grid
method: grid
metric:
  name: val_loss
  goal: minimize
parameters:
  lr: {values: [0.01, 0.1]}
  hidden: {values: [32, 64]}
program: python examples/sweep_training.py --steps 30
"""

EMPTY_PARAMETERS = """\
name: digits-empty
method: grid
metric: {name: val_loss, goal: minimize}
parameters: {}
program: python examples/sweep_training.py
"""


def _team():
    project = ProjectFactory(name="Vision", slug="vision")
    dana = UserFactory(username="dana")
    MembershipFactory(user=dana, project=project, role=Role.MEMBER)
    MembershipFactory(user=UserFactory(username="victor"), project=project, role=Role.VIEWER)
    return project, dana


def _run_trial(actor, trial: SweepTrial, *, losses: list[float] | None, end: str) -> None:
    """What the trial's program does: start its Run under the trial's id, log ``val_loss`` per step, end it."""
    started = run_start(
        actor=actor,
        project=trial.run.project,
        external_id=trial.run.external_id,
        resume="allow",
        host="gpu-node-1",
        pid=4000 + trial.number,
    )
    for step, loss in enumerate(losses or []):
        metrics_ingest(actor=actor, run=started.run, points=[{"key": "val_loss", "value": loss, "step": step}])
    run_services.run_set_status(actor=actor, run=started.run, status=end)


def _cell_texts(row) -> list[str]:
    return [text.strip() for text in row.locator("td").all_inner_texts()]


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_member_creates_a_grid_sweep_from_yaml_and_reads_its_trials_and_a_viewer_cannot_create(browser_page):
    page = browser_page
    project, dana = _team()

    log_in(page, "dana", "/projects/vision/")
    expect(page).to_have_url(re.compile(r"/projects/vision/$"))
    page.locator(".page-head .actions").get_by_role("link", name="Sweeps").click()
    expect(page).to_have_url(re.compile(r"/projects/vision/sweeps/$"))
    expect(page.locator("p.empty")).to_contain_text("No sweeps in this project yet")
    page.get_by_role("link", name="New sweep").click()
    expect(page).to_have_url(re.compile(r"/projects/vision/sweeps/new/$"))
    config = page.get_by_label("Configuration (YAML or JSON)")
    expect(config).to_have_value(re.compile(r"^name: digits-lr\nmethod: bayes"))  # the example to start from

    # A config with an empty parameter space: 400, the error names the field, nothing is created.
    config.fill(EMPTY_PARAMETERS)
    with page.expect_response(lambda r: r.request.method == "POST" and "/sweeps/new/" in r.url) as posted:
        page.get_by_role("button", name="Create sweep").click()
    assert posted.value.status == 400
    expect(page).to_have_url(re.compile(r"/projects/vision/sweeps/new/$"))
    expect(page.locator("ul.errorlist.summary")).to_have_text(
        "Configuration (YAML or JSON): parameters: parameters must be a non-empty mapping of name to its values "
        "or range"
    )
    expect(page.locator('.field[data-field="config"]')).to_have_class(re.compile(r"\bhas-error\b"))
    expect(config).to_have_value(EMPTY_PARAMETERS)  # what was typed is kept to correct it
    screenshot(page, "sweep-create-error")
    assert Sweep.objects.count() == 0

    config.fill(GRID)
    page.get_by_role("button", name="Create sweep").click()
    sweep = Sweep.objects.get()
    expect(page).to_have_url(re.compile(rf"/sweeps/{sweep.pk}/$"))
    expect(page.locator(".message")).to_contain_text(f"Sweep {sweep.pk} was created")
    expect(page.get_by_role("heading", level=1)).to_contain_text("digits-grid")
    expect(page.locator("code.agent-command")).to_have_text(f"mado agent {sweep.pk}")
    facts = page.locator(".sweep-facts")
    expect(facts).to_contain_text("grid")
    expect(facts).to_contain_text("val_loss (minimize)")
    expect(facts.locator(".trial-counts")).to_have_text("0 trials: 0 done, 0 running, 0 queued, 0 claimed")
    expect(page.locator(".best-trial .empty")).to_have_text("No trial has logged val_loss yet.")
    expect(page.locator("table.trials")).to_have_count(0)
    assert (sweep.project_id, sweep.method, sweep.run_cap, sweep.created_by_id) == (project.pk, "grid", 4, dana.pk)
    assert sweep.parameters == {"lr": {"values": [0.01, 0.1]}, "hidden": {"values": [32, 64]}}

    # Agents claim all 4 trials; two programs log val_loss and finish, one logs a lower val_loss but is
    # preempted (back to the queue: a partial result), the fourth is still claimed.
    trials = [sweep_claim(actor=dana, sweep=sweep, agent="gpu-node-1:4242").trial for _ in range(4)]
    assert [t.number for t in trials] == [1, 2, 3, 4]
    assert sweep_claim(actor=dana, sweep=sweep).trial is None  # the grid is exhausted
    _run_trial(dana, trials[0], losses=[0.9, 0.6, 0.42], end=RunStatus.FINISHED)
    _run_trial(dana, trials[1], losses=[0.8, 0.3, 0.17], end=RunStatus.FINISHED)
    _run_trial(dana, trials[2], losses=[0.5, 0.05], end=RunStatus.PREEMPTED)

    page.reload()
    expect(facts.locator(".trial-counts")).to_have_text("4 trials: 2 done, 0 running, 1 queued, 1 claimed")
    table = page.locator("table.trials")
    expect(table.locator("thead th")).to_have_text(["#", "hidden", "lr", "val_loss", "State", "Requeued", "Run"])
    expect(table.locator("tbody tr")).to_have_count(4)
    expected = {  # number: (metric, state label, data-state, requeues)
        1: ("0.42", "finished", "done", "0"),
        2: ("0.17", "finished", "done", "0"),
        3: ("0.05", "queued", "queued", "1"),
        4: ("—", "claimed", "leased", "0"),
    }
    for trial in trials:
        metric, label, state, requeues = expected[trial.number]
        row = table.locator(f'tbody tr[data-trial="{trial.number}"]')
        cells = _cell_texts(row)
        assert cells[:3] == [str(trial.number), str(trial.parameters["hidden"]), str(trial.parameters["lr"])], cells
        expect(row.locator("td.metric")).to_have_text(metric)
        expect(row.locator(".badge.trial-state")).to_have_text(label)
        expect(row.locator(".badge.trial-state")).to_have_attribute("data-state", state)
        expect(row.locator("td.requeues")).to_have_text(requeues)
        expect(row.get_by_role("link", name=trial.run.external_id)).to_have_attribute("href", f"/runs/{trial.run_id}/")
    assert {(t.parameters["lr"], t.parameters["hidden"]) for t in trials} == {
        (0.01, 32),
        (0.01, 64),
        (0.1, 32),
        (0.1, 64),
    }  # the grid, each point once

    # The best trial is the finished one with the lowest val_loss (trial 2; trial 3's 0.05 is partial), in the
    # card and highlighted in the table.
    best = page.locator(".best-trial")
    expect(best).to_have_attribute("data-trial", "2")
    expect(best.locator("dd.metric")).to_have_text("0.17")
    expect(best.get_by_role("link", name=re.compile(r"digits-grid-2"))).to_have_attribute(
        "href", f"/runs/{trials[1].run_id}/"
    )
    expect(best.locator(".badge.status")).to_have_text("finished")
    expect(table.locator("tbody tr.best")).to_have_count(1)
    expect(table.locator("tbody tr.best")).to_have_attribute("data-trial", "2")

    # One uPlot scatter per searched parameter, one dot per trial with a metric in three series (finished, best,
    # not finished); hovering a dot names its trial.
    expect(page.locator("figure.sweep-scatter")).to_have_count(2)
    for name in ("hidden", "lr"):
        scatter = page.locator(f'figure.sweep-scatter[data-parameter="{name}"]')
        expect(scatter.locator(".uplot canvas")).to_be_visible()
        expect(scatter.locator("figcaption")).to_contain_text("3 trials")
        expect(scatter).to_have_attribute("data-drawn", "3")
        expect(scatter.locator(".u-legend .u-series")).to_have_text(
            ["finished", "best trial", "not finished (partial)"]
        )
        for trial, label in ((trials[1], "Trial 2"), (trials[2], "Trial 3")):
            x, y = scatter.evaluate(
                "(figure, p) => { const u = figure.chart, box = u.over.getBoundingClientRect();"
                " return [box.left + u.valToPos(p[0], 'x'), box.top + u.valToPos(p[1], 'y')]; }",
                [trial.parameters[name], {2: 0.17, 3: 0.05}[trial.number]],
            )
            page.mouse.move(x, y)
            expect(scatter.locator(".scatter-hover")).to_contain_text(f"{label}: {name} = {trial.parameters[name]}")
        expect(scatter.locator(".scatter-hover")).to_contain_text("(partial: the run is preempted)")
    # The y axis is val_loss growing upwards: trial 2's lower loss is drawn below trial 1's.
    lr = page.locator('figure.sweep-scatter[data-parameter="lr"]')
    assert lr.evaluate("figure => figure.chart.valToPos(0.17, 'y') > figure.chart.valToPos(0.42, 'y')")
    page.mouse.move(5, 5)
    screenshot(page, "sweep-detail")

    # A trial's Run links back to its sweep.
    table.locator('tbody tr[data-trial="2"]').get_by_role("link", name=trials[1].run.external_id).click()
    expect(page).to_have_url(re.compile(rf"/runs/{trials[1].run_id}/$"))
    expect(page.locator("dd.sweep-trial")).to_have_text("digits-grid · trial 2")
    page.locator("dd.sweep-trial").get_by_role("link", name="digits-grid").click()
    expect(page).to_have_url(re.compile(rf"/sweeps/{sweep.pk}/$"))

    page.get_by_role("link", name="Sweeps").last.click()
    row = page.locator(f'table.sweeps tr[data-sweep="{sweep.pk}"]')
    expect(row.locator("td")).to_have_text(
        [re.compile(r"digits-grid"), "grid", "val_loss (minimize)", "4 / 4", "0", "1", "dana", re.compile(r"\d")]
    )
    screenshot(page, "sweep-list")

    # A viewer reads the sweep pages but has no "New sweep" button and is refused the form.
    page.get_by_role("button", name="Log out").click()
    log_in(page, "victor", "/projects/vision/sweeps/")
    expect(page).to_have_url(re.compile(r"/projects/vision/sweeps/$"))
    expect(page.locator(f'table.sweeps tr[data-sweep="{sweep.pk}"]')).to_be_visible()
    expect(page.get_by_role("link", name="New sweep")).to_have_count(0)
    expect(page.locator(".page-head .reason")).to_have_text(
        "Your role in this project is viewer: viewers can only read."
    )
    page.get_by_role("link", name="digits-grid").click()
    expect(page.locator("table.trials tbody tr")).to_have_count(4)
    expect(page.locator(".best-trial")).to_have_attribute("data-trial", "2")
    screenshot(page, "sweep-detail-viewer")

    page.goto("/projects/vision/sweeps/new/")
    expect(page.locator("p.errorlist[role=alert]")).to_have_text(
        "Your role in this project is viewer: viewers can only read."
    )
    expect(page.locator("textarea")).to_have_count(0)
    expect(page.get_by_role("button", name="Create sweep")).to_have_count(0)
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    refused = page.request.post(
        "/projects/vision/sweeps/new/", form={"config": GRID}, headers={"X-CSRFToken": csrf, "Referer": page.url}
    )
    assert refused.status == 403
    assert Sweep.objects.count() == 1


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_run_page_of_a_resumed_run_shows_resumes_writer_replayed_steps_and_parameter_changes(browser_page):
    page = browser_page
    project, dana = _team()

    first = run_start(
        actor=dana,
        project=project,
        external_id="exp-42",
        resume="allow",
        host="gpu-node-1",
        pid=1111,
        name="exp-42",
        parameters={"lr": 0.1, "batch_size": 64},
    )
    assert first.created
    metrics_ingest(
        actor=dana,
        run=first.run,
        points=[{"key": "train.loss", "value": 2.0 * 0.9**step, "step": step} for step in range(10)],
    )
    run_services.run_set_status(actor=dana, run=first.run, status=RunStatus.FAILED)

    resumed = run_start(
        actor=dana,
        project=project,
        external_id="exp-42",
        resume="allow",
        host="gpu-node-7",
        pid=2222,
        parameters={"lr": 0.05, "epochs": 3},
        allow_param_change=True,
    )
    assert (resumed.resumed, resumed.last_step, resumed.run.pk) == (True, 9, first.run.pk)
    ingested = metrics_ingest(
        actor=dana,
        run=resumed.run,
        points=[  # a restart from step 5: 5..9 are below 10
            {"key": "train.loss", "value": 2.0 * 0.9**step, "step": step} for step in range(5, 15)
        ],
    )
    assert (ingested.dropped, ingested.compared) == (0, 5)  # compared with the first ones, not dropped
    run = resumed.run

    log_in(page, "dana", f"/runs/{run.pk}/")
    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
    expect(page.locator("dd .badge.status").first).to_have_text("running")
    expect(page.locator("dd.resume-count")).to_have_text("1 time")
    expect(page.locator("dd.writer")).to_have_text(
        re.compile(r"^gpu-node-7 \(pid 2222\) since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
    )
    expect(page.locator("dd.heartbeat time")).to_have_attribute("datetime", re.compile(r"^\d{4}-"))
    expect(page.locator(".warn-box.dropped-points")).to_have_count(0)
    segment = page.locator('.resume-segment[data-number="1"]')
    expect(segment).to_have_attribute("data-verdict", "identical")
    expect(segment).to_contain_text("Steps 5–9 logged again are identical to the first ones, bit for bit.")
    params = page.locator("table.params tbody tr")
    expect(params).to_have_count(3)
    expect(page.locator("table.params")).to_contain_text("epochs")
    expect(params.filter(has_text="lr")).to_contain_text("0.05")
    changes = page.locator("table.parameter-changes tbody tr")
    expect(changes).to_have_count(1)
    assert _cell_texts(changes.first)[:4] == ["lr", "0.1", "0.05", "dana"]
    expect(page.locator("dd.sweep-trial")).to_have_count(0)  # not a sweep trial
    # the chart holds each step once: 0..9 from the first start, 10..14 after the resume
    expect(page.locator('figure.metric-chart[data-key="train.loss"] .uplot canvas')).to_be_visible()
    screenshot(page, "run-resumed")
