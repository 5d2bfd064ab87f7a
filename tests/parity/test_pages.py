"""What the pages show of a resumed Run (docs/design/resume.md#restore-report, #parity): the verdict badge on the Run
page, the Job page, the Jobs list and Compare; the parts not restored; the "resume ignored?" warning on the Job page."""

import re
from html import unescape

import pytest
from django.urls import reverse

from checkpoints.models import Checkpoint
from parity.services import restore_report_record
from tests.jobs.conftest import (  # noqa: F401
    celery_calls,
    checkpoint,
    code_version,
    cpu,
    dataset_versions,
    failed_job,
)
from tests.parity.conftest import curve
from tests.parity.test_api import resumed_job  # noqa: F401

pytestmark = pytest.mark.django_db

REPORT = {
    "parts": {"model": "restored", "scheduler": "not_restored", "rng.python": "not_restored"},
    "details": {"scheduler": "scheduler rebuilt: its state differs from the checkpoint's"},
}


def text(response) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", "", response.content.decode())))


def test_the_run_page_shows_the_verdict_and_what_was_not_restored(login, creator, log, failed_job, resumed_job):
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 30))
    restore_report_record(actor=creator, run=resumed_job.run, body=REPORT)
    page = login(creator).get(reverse("runs:run-detail", args=[resumed_job.run_id]))
    html = page.content.decode()
    assert html.count('data-verdict="identical"') >= 2  # the header's badge and the Resume check card
    shown = text(page)
    assert "Identical to the parent run, bit for bit, over steps 20–26 on every key both logged" in shown
    assert "Not restored from the checkpoint: rng.python, scheduler." in shown
    assert "scheduler scheduler rebuilt: its state differs from the checkpoint's" in shown
    compare = reverse("runs:project-compare", args=[failed_job.run.project.slug])
    assert f"{compare}?run={failed_job.run_id}&amp;run={resumed_job.run_id}" in html


def test_the_job_page_warns_of_an_ignored_checkpoint_and_names_the_diverged_step(
    login, creator, log, failed_job, resumed_job
):
    log(failed_job.run, range(27))
    log(resumed_job.run, range(0, 30), value=lambda key, step: curve(key, step) + (0.5 if step >= 22 else 0))
    shown = text(login(creator).get(reverse("jobs:job-detail", args=[resumed_job.pk])))
    assert "started from the checkpoint at step 20, but its first logged step is 0" in shown
    parent = curve("train.accuracy", 22)
    assert f"Diverged from the parent run at step 22: train.accuracy was {parent!r} in the parent run" in shown


def test_a_checkpoint_not_loaded_is_shown_on_the_run_and_job_pages_until_a_restore_report_comes(
    login, creator, log, failed_job, resumed_job
):
    from tests.jobs.test_japanese_pages import english_left
    from tests.parity.test_api import TRAINING_STATE

    Checkpoint.objects.filter(pk=resumed_job.run.source_checkpoint_id).update(
        metadata={"training_state": TRAINING_STATE}
    )
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 30))
    client = login(creator)
    pages = [reverse("runs:run-detail", args=[resumed_job.run_id]), reverse("jobs:job-detail", args=[resumed_job.pk])]
    for url in pages:
        shown = text(client.get(url))
        assert "step 20, which holds a training state, but sent no restore report before its first metrics" in shown
        assert "first logged step is" not in shown, url  # not the started-below case
    client.post(reverse("set_language"), {"language": "ja", "next": "/"})
    html = client.get(pages[1]).content.decode()
    assert "最初のメトリクス（step 20）より前に復元レポートを送っていません" in html
    assert english_left(html, {failed_job.run.name, resumed_job.run.name, failed_job.run.project.name}) == []
    restore_report_record(actor=creator, run=resumed_job.run, body={"parts": {"model": "restored"}})
    assert all('class="warn-box checkpoint-not-loaded"' not in client.get(url).content.decode() for url in pages)


def test_the_jobs_list_and_compare_show_the_badge(login, creator, log, failed_job, resumed_job):
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 30), value=lambda key, step: curve(key, step) * (1 + 1e-9))
    client = login(creator)
    listed = client.get(reverse("jobs:project-jobs", args=[failed_job.run.project.slug])).content.decode()
    row = re.search(rf'<tr data-job="{resumed_job.pk}".*?</tr>', listed, re.S).group(0)
    assert 'data-verdict="within_tolerance"' in row
    failed_row = re.search(rf'<tr data-job="{failed_job.pk}".*?</tr>', listed, re.S).group(0)
    assert "data-verdict" not in failed_row
    compare = client.get(
        reverse("runs:project-compare", args=[failed_job.run.project.slug]),
        {"run": [failed_job.run_id, resumed_job.run_id]},
    )
    shown = text(compare)
    assert "from the checkpoint at step 20" in shown and "within tolerance" in shown


def test_the_resume_facts_read_in_japanese(login, creator, log, failed_job, resumed_job):
    from tests.jobs.test_japanese_pages import english_left

    log(failed_job.run, range(27))
    log(resumed_job.run, range(0, 30), value=lambda key, step: curve(key, step) + (0.5 if step >= 22 else 0))
    restore_report_record(actor=creator, run=resumed_job.run, body=REPORT)
    client = login(creator)
    client.post(reverse("set_language"), {"language": "ja", "next": "/"})
    slug = failed_job.run.project.slug
    pages = [
        reverse("runs:run-detail", args=[resumed_job.run_id]),
        reverse("jobs:job-detail", args=[resumed_job.pk]),
        reverse("jobs:project-jobs", args=[slug]),
        reverse("runs:project-compare", args=[slug]) + f"?run={failed_job.run_id}&run={resumed_job.run_id}",
    ]
    allowed = {
        failed_job.run.name,
        resumed_job.run.name,
        failed_job.run.project.name,
        "trainer",
        REPORT["details"]["scheduler"],
    }
    for url in pages:
        html = client.get(url).content.decode()
        assert "一致判定" in html or "分岐" in html, url
        assert english_left(html, allowed) == [], url


def test_a_part_not_declared_is_shown_with_the_call_that_declares_it_in_english_and_japanese(
    login, creator, log, failed_job, resumed_job
):
    from tests.jobs.test_japanese_pages import english_left

    line = "the checkpoint declares no data position: declare it with save_checkpoint(..., data_position=...)"
    body = {"parts": {"model": "restored", "data_position": "not_declared"}, "details": {"data_position": line}}
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 30))
    restore_report_record(actor=creator, run=resumed_job.run, body=body)
    client = login(creator)
    page = reverse("runs:run-detail", args=[resumed_job.run_id])
    shown = text(client.get(page))
    assert f"Not declared in the checkpoint, so not checked: data_position. data_position {line}" in shown
    assert "Not restored from the checkpoint" not in shown and "Everything the checkpoint holds was restored." in shown
    client.post(reverse("set_language"), {"language": "ja", "next": "/"})
    html = client.get(page).content.decode()
    assert "チェックポイントで宣言されていないため確認できなかったもの: data_position。" in text(client.get(page))
    allowed = {failed_job.run.name, resumed_job.run.name, failed_job.run.project.name, "trainer", line}
    assert english_left(html, allowed) == []
