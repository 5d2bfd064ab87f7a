"""A continue that changes a parameter on purpose: the verdict names the change and whether it took effect, from the
logged series or the restore report; a divergence before it took effect is still one (docs/design/resume.md
#declared-changes)."""

import re

import pytest
from django.urls import reverse

from jobs import services as job_services
from parity.declared import declared_verdict
from parity.selectors import declared_verdicts_by_run
from parity.services import restore_report_record
from runs.models import ParameterChange, Run
from tests.jobs.conftest import (  # noqa: F401
    celery_calls,
    checkpoint,
    code_version,
    cpu,
    dataset_versions,
    failed_job,
)
from tests.parity.conftest import KEYS, curve
from tests.parity.test_pages import text

pytestmark = pytest.mark.django_db

LOGGED = (*KEYS, "train.lr")
OLD, NEW = 0.1, 0.02  # failed_job's lr, and the continue's
OVERRIDDEN_REPORT = {"parts": {"model": "restored", "optimizer": "restored", "scheduler": "restored"}}
SET_AFTER_LOAD = {
    "parts": {"model": "restored", "optimizer": "not_restored", "scheduler": "restored"},
    "details": {
        "optimizer": "param group 0: lr 0.1 at the load, 0.02 at the first optimizer step: set after "
        "load_checkpoint, not by the restored scheduler (its lr: 0.1)"
    },
}


def parent_curve(key, step):
    return OLD if key == "train.lr" else curve(key, step)


def trained_at(lr_from: int, loss_from: int):
    """The continued Run's values: its lr the new one from step ``lr_from``, its loss and accuracy apart from
    ``loss_from``."""

    def value(key, step):
        if key == "train.lr":
            return NEW if step >= lr_from else OLD
        return curve(key, step) + (0.25 if step >= loss_from else 0)

    return value


def continue_from(creator, source, code_version, cpu):
    """The Run of a continue from checkpoint ``source`` with ``--param lr=0.02`` (and ``epochs=3``)."""
    job = job_services.run_continue_from_checkpoint(
        actor=creator,
        checkpoint=source,
        code_version=code_version,
        queue=cpu,
        parameters={**source.run.parameters, "lr": NEW, "epochs": 3},
        dataset_version_ids=[],
    )
    return job.run


@pytest.fixture
def continued(creator, failed_job, cpu, code_version, log):
    """``failed_job`` (logged 0..26 at lr 0.1, checkpoint at 20) continued from step 20 with ``--param lr=0.02``."""
    log(failed_job.run, range(27), keys=LOGGED, value=parent_curve)
    return continue_from(creator, checkpoint(failed_job.run, 20), code_version, cpu)


def row_of(html: str, job_id: int) -> str:
    """The text of the Jobs list's row of Job ``job_id``."""
    row = re.search(rf'<tr data-job="{job_id}".*?</tr>', html, re.S).group(0)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", row))


def test_the_continue_records_each_parameter_it_changed(continued):
    changes = ParameterChange.objects.filter(run=continued).values_list("key", "old_value", "new_value")
    assert sorted(changes) == [("epochs", None, 3), ("lr", OLD, NEW)]


def test_a_changed_lr_seen_in_the_logged_series_is_changed_on_purpose_from_the_step_it_took_effect(
    api, login, creator, log, continued
):
    log(continued, range(20, 30), keys=LOGGED, value=trained_at(lr_from=21, loss_from=22))
    parity = api(creator).get(f"/api/v1/runs/{continued.pk}/").json()["parity"]
    assert (parity["verdict"], parity["step"], parity["key"]) == ("diverged", 21, "train.lr")
    lr = next(change for change in parity["declared"]["changes"] if change["key"] == "lr")
    assert lr == {
        "key": "lr",
        "old_value": OLD,
        "new_value": NEW,
        "took_effect_at_step": 21,
        "overridden": False,
        "overridden_by": "",
        "evidence": "train.lr",
    }
    assert parity["declared"]["divergence_declared"] is True
    page = login(creator).get(reverse("runs:run-detail", args=[continued.pk]))
    shown = text(page)
    assert "changed on purpose: lr 0.1 → 0.02 (took effect at step 21)" in shown
    assert "changed on purpose from step 21" in shown  # the badge, not "diverged at step 21"
    assert "Diverged from the parent run" not in shown and "diverged at step" not in shown
    assert 'data-declared="true"' in page.content.decode()


def test_a_changed_lr_the_restored_scheduler_put_back_says_the_optimizer_still_ran_at_the_old_one(
    api, login, creator, log, continued
):
    restore_report_record(actor=creator, run=continued, body=OVERRIDDEN_REPORT)
    log(continued, range(20, 30), keys=LOGGED, value=parent_curve)
    parity = api(creator).get(f"/api/v1/runs/{continued.pk}/").json()["parity"]
    assert parity["verdict"] == "identical"
    lr = next(change for change in parity["declared"]["changes"] if change["key"] == "lr")
    assert (lr["took_effect_at_step"], lr["overridden"], lr["overridden_by"]) == (None, True, "scheduler")
    assert parity["declared"]["divergence_declared"] is False
    shown = text(login(creator).get(reverse("runs:run-detail", args=[continued.pk])))
    assert (
        "changed on purpose: lr 0.1 → 0.02 — but the optimizer still ran at 0.1 (the restored scheduler overrode it)"
        in shown
    )
    ja = text(login(creator).get(reverse("runs:run-detail", args=[continued.pk]), HTTP_ACCEPT_LANGUAGE="ja"))
    assert "意図した変更: lr 0.1 → 0.02 — ただしオプティマイザは 0.1 のまま動いた" in ja
    assert "（復元したスケジューラが上書きした）" in ja


def test_a_divergence_before_the_change_took_effect_is_still_a_divergence(api, login, creator, log, continued):
    log(continued, range(20, 30), keys=LOGGED, value=trained_at(lr_from=23, loss_from=21))
    parity = api(creator).get(f"/api/v1/runs/{continued.pk}/").json()["parity"]
    assert (parity["verdict"], parity["step"], parity["key"]) == ("diverged", 21, "train.accuracy")
    assert parity["declared"]["divergence_declared"] is False
    shown = text(login(creator).get(reverse("runs:run-detail", args=[continued.pk])))
    assert "Diverged from the parent run at step 21: train.accuracy" in shown
    assert "changed on purpose: lr 0.1 → 0.02 (took effect at step 23)" in shown


def test_without_a_logged_lr_the_restore_report_says_at_which_rate_the_first_step_ran(api, creator, log, continued):
    restore_report_record(actor=creator, run=continued, body=SET_AFTER_LOAD)
    log(continued, range(20, 30), value=trained_at(lr_from=20, loss_from=21))
    declared = api(creator).get(f"/api/v1/runs/{continued.pk}/").json()["parity"]["declared"]
    lr = next(change for change in declared["changes"] if change["key"] == "lr")
    assert (lr["took_effect_at_step"], lr["overridden"], lr["evidence"]) == (20, False, "restore_report")
    assert declared["divergence_declared"] is True
    epochs = next(change for change in declared["changes"] if change["key"] == "epochs")
    assert (epochs["took_effect_at_step"], epochs["overridden"], epochs["evidence"]) == (None, False, "")


def test_a_resume_that_changed_nothing_has_no_declared_changes(api, creator, log, failed_job):
    log(failed_job.run, range(27))
    checkpoint(failed_job.run, 20)
    resumed = job_services.job_resume_from_latest(actor=creator, job=failed_job)
    log(resumed.run, range(20, 30))
    assert api(creator).get(f"/api/v1/jobs/{resumed.pk}/").json()["parity"]["declared"] is None


@pytest.mark.parametrize(
    ("details", "parts", "expected"),
    [
        ("param group 0: lr 0.05 at the load, 0.02 at the first optimizer step: set", {}, (7, False, "")),
        ("param group 0: lr 0.02 at the load, 0.05 at the first optimizer step: set", {}, (None, True, "")),
        ("", {"optimizer": "restored"}, (None, True, "optimizer")),
        ("", {"optimizer": "unknown"}, (None, False, "")),
    ],
)
def test_the_restore_report_decides_a_learning_rate_no_metric_shows(details, parts, expected):
    declared = declared_verdict(
        changes=[("learning_rate", 0.05, 0.02)],
        diverged_at={"train.loss": 9},
        parts=parts,
        details={"optimizer": details} if details else {},
        first_step=7,
        diverged_step=9,
    )
    (change,) = declared.changes
    assert (change.took_effect_at_step, change.overridden, change.overridden_by) == expected
    assert declared.divergence_declared is (expected[0] is not None)


def test_a_metric_logged_under_another_spelling_of_the_name_is_the_one_compared():
    declared = declared_verdict(
        changes=[("lr", 0.05, 0.02), ("optimizer", "sgd", "adam")],
        diverged_at={"train/learning_rate": 12, "train.loss": 13},
        parts={},
        details={},
        first_step=10,
        diverged_step=12,
    )
    lr, optimizer = declared.changes
    assert (lr.took_effect_at_step, lr.evidence) == (12, "train/learning_rate")
    assert (optimizer.took_effect_at_step, optimizer.evidence) == (None, "")
    assert declared.divergence_declared


def test_a_continue_on_another_data_mix_is_a_data_change_from_the_checkpoints_step(
    api, login, creator, log, failed_job, code_version, cpu, dataset_versions
):
    log(failed_job.run, range(27))
    job = job_services.run_continue_from_checkpoint(
        actor=creator,
        checkpoint=checkpoint(failed_job.run, 20),
        code_version=code_version,
        queue=cpu,
        dataset_version_ids=[dataset_versions[0].pk],  # the source trained on v1 and v2
    )
    log(job.run, range(20, 30), value=trained_at(lr_from=99, loss_from=21))
    parity = api(creator).get(f"/api/v1/jobs/{job.pk}/").json()["parity"]
    assert parity["declared"]["changes"] == [
        {
            "key": "data",
            "old_value": ["digits:v1", "digits:v2"],
            "new_value": ["digits:v1"],
            "took_effect_at_step": 20,
            "overridden": False,
            "overridden_by": "",
            "evidence": "data_stage",
        }
    ]
    assert (parity["verdict"], parity["step"], parity["declared"]["divergence_declared"]) == ("diverged", 21, True)
    shown = text(login(creator).get(reverse("runs:run-detail", args=[job.run_id])))
    assert 'changed on purpose: data ["digits:v1", "digits:v2"] → ["digits:v1"] (took effect at step 20)' in shown
    listed = login(creator).get(reverse("jobs:project-jobs", args=[job.run.project.slug])).content.decode()
    assert "changed on purpose from step 21" in row_of(listed, job.pk)


@pytest.mark.parametrize(
    ("lr_from", "loss_from", "badge", "not_badge"),
    [
        (21, 22, "changed on purpose from step 21", "diverged at step"),
        (23, 21, "diverged at step 21", "changed on purpose from step"),  # before the change took effect
    ],
)
def test_the_jobs_list_and_compare_read_the_badge_as_the_run_page_does(
    login, creator, log, failed_job, continued, lr_from, loss_from, badge, not_badge
):
    log(continued, range(20, 30), keys=LOGGED, value=trained_at(lr_from=lr_from, loss_from=loss_from))
    client = login(creator)
    slug = continued.project.slug
    row = row_of(client.get(reverse("jobs:project-jobs", args=[slug])).content.decode(), continued.job.pk)
    assert badge in row and not_badge not in row
    compared = text(
        client.get(reverse("runs:project-compare", args=[slug]), {"run": [failed_job.run_id, continued.pk]})
    )
    assert badge in compared and not_badge not in compared
    assert badge in text(client.get(reverse("runs:run-detail", args=[continued.pk])))


def test_the_jobs_list_judges_its_rows_declared_changes_in_a_few_queries(
    login, creator, log, failed_job, code_version, cpu, django_assert_max_num_queries
):
    log(failed_job.run, range(27), keys=LOGGED, value=parent_curve)
    source = checkpoint(failed_job.run, 20)
    runs = [continue_from(creator, source, code_version, cpu) for _ in range(4)]
    for run in runs:
        log(run, range(20, 21), keys=LOGGED, value=parent_curve)  # identical so far: nothing to judge
    client, url = login(creator), reverse("jobs:project-jobs", args=[failed_job.run.project.slug])
    assert "changed on purpose from step" not in client.get(url).content.decode()
    with django_assert_max_num_queries(10_000) as before:
        client.get(url)
    for run in runs:
        log(run, range(21, 30), keys=LOGGED, value=trained_at(lr_from=21, loss_from=22))
    with django_assert_max_num_queries(len(before.captured_queries) + 4):  # the rows' changes, stages, reports, blocks
        listed = client.get(url).content.decode()
    assert [("changed on purpose from step 21" in row_of(listed, run.job.pk)) for run in runs] == [True] * 4
    loaded = list(Run.objects.filter(pk__in=[failed_job.run_id, *(run.pk for run in runs)]).select_related("parity"))
    with django_assert_max_num_queries(4):
        declared = declared_verdicts_by_run(runs=loaded)
    assert sorted(declared) == sorted(run.pk for run in runs)
    assert all(verdict.divergence_declared for verdict in declared.values())
