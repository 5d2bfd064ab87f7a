"""The Japanese pages say nothing in English (docs/design/interfaces.md#surfaces): every page of a Project with a failed
Job, its Run, checkpoints, a sweep with a failed trial, and the messages services raise into pages, read with the UI in
Japanese. Names the user typed, code, ids, units and product names may stay as they are."""

import re
from html import unescape
from html.parser import HTMLParser

import pytest
from django.urls import reverse

from runs.models import RunStatus
from runs.services import run_set_status
from sweeps.services import sweep_claim
from tests.jobs.conftest import checkpoint
from tests.sweeps.sweep_helpers import make_sweep, start_program

pytestmark = pytest.mark.django_db

# Words of the English UI (labels, buttons, messages); a Japanese page shows none of them outside code and names.
ENGLISH = re.compile(
    r"(?<![/_.])\b(Jobs?|[Cc]heckpoints?|Artifacts?|Resume|Continue|Delete|Download|Abort|Launch|Retry|Trials?|Sweeps?|"
    r"Overview|Logs|System|Projects?|Members?|Status|Created|Started|Duration|Parameters|Metrics?|Compare|"
    r"Queue|Worker|Kind|Training|Show|Hide|Back|Cancel|Only|Your|This|The|cannot|not|is|are|was|of|from|with)\b(?![/_(])"
)


class VisibleText(HTMLParser):
    """The text a person reads: outside <script>, <style>, <code>, <pre>, <time>, <textarea> and <option>."""

    SKIP = {"script", "style", "code", "pre", "time", "textarea", "option", "kbd"}

    def __init__(self):
        super().__init__()
        self.depth, self.parts = 0, []

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.depth += 1
        if not self.depth:
            self.parts += [value for name, value in attrs if name in ("title", "aria-label", "placeholder") and value]

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth and data.strip():
            self.parts.append(data.strip())


def english_left(html: str, allowed: set[str]) -> list[str]:
    """The text pieces of ``html``'s <main> that still hold English UI words, less the ``allowed`` names."""
    parser = VisibleText()
    parser.feed(html.split("<main", 1)[-1])
    return [part for part in parser.parts if part not in allowed and ENGLISH.search(part)]


@pytest.fixture
def ja(login, creator):
    client = login(creator)
    client.post(reverse("set_language"), {"language": "ja", "next": "/"})
    return client


def test_every_page_of_a_project_reads_in_japanese(ja, creator, failed_job, project):
    run = failed_job.run
    kept = checkpoint(run, 20)
    sweep = make_sweep(actor=creator, project=project)
    trial = sweep_claim(actor=creator, sweep=sweep, agent="gpu-1:1").trial
    run_set_status(actor=creator, run=start_program(actor=creator, trial=trial), status=RunStatus.FAILED)
    allowed = {run.name, project.name, sweep.name, failed_job.code_version.code.name}
    pages = [
        reverse("runs:project-list"),
        reverse("runs:project-detail", args=[project.slug]),
        reverse("jobs:project-jobs", args=[project.slug]),
        reverse("jobs:job-detail", args=[failed_job.pk]),
        reverse("runs:run-detail", args=[run.pk]),
        reverse("runs:run-checkpoints", args=[run.pk]),
        reverse("runs:run-checkpoints", args=[run.pk]) + "?older=1",
        reverse("checkpoints:checkpoint-detail", args=[kept.pk]),
        reverse("jobs:checkpoint-resume", args=[kept.pk]),
        reverse("jobs:checkpoint-continue", args=[kept.pk]),
        reverse("runs:sweep-list", args=[project.slug]),
        reverse("runs:sweep-detail", args=[sweep.pk]),
        reverse("runs:sweep-create", args=[project.slug]),
        reverse("jobs:job-launch", args=[project.slug]),
        reverse("runs:project-compare", args=[project.slug]) + f"?run={run.pk}&run={trial.run_id}",
        reverse("runs:run-system", args=[run.pk]),
        reverse("runs:run-data-history", args=[run.pk]),
        reverse("runs:run-artifacts", args=[run.pk]),
        reverse("runs:run-logs", args=[run.pk]),
    ]
    left = {}
    for url in pages:
        response = ja.get(url)
        assert response.status_code == 200, url
        found = english_left(response.content.decode(), allowed)
        if found:
            left[url] = found
    assert left == {}


def test_messages_that_services_raise_into_pages_read_in_japanese(ja, login, admin, failed_job, project):
    """A refused sweep config, a bad compare selection, a bad sort and column, an abort of an ended Job and a
    refused membership change: each message is the service's, shown on the page in Japanese."""
    flows = [
        (
            ja.post(
                reverse("runs:sweep-create", args=[project.slug]),
                {"config": "method: annealing\nmetric: {name: x}\nparameters: {a: {values: [1]}}\nprogram: p\n"},
            ),
            "method は grid, random, bayes のいずれかにしてください（指定値: 'annealing'）",
        ),
        (ja.get(reverse("runs:project-compare", args=[project.slug]) + "?run=abc"), "'abc' はRunのIDではありません"),
        (
            ja.get(reverse("runs:project-detail", args=[project.slug]) + "?sort=nonsense"),
            "'nonsense' では並べ替えられません: 表示中の列ではありません",
        ),
        (
            ja.post(reverse("runs:project-columns", args=[project.slug]), {"col": ["bogus"]}, follow=True),
            "'bogus': param:NAME または metric:KEY:last|min|max の形で指定してください",
        ),
        (
            ja.post(reverse("jobs:job-abort", args=[failed_job.pk]), follow=True),
            f"ジョブ {failed_job.pk} はすでに failed で終了しています。中止するものはありません",
        ),
    ]
    administrator = login(admin)
    administrator.post(reverse("set_language"), {"language": "ja", "next": "/"})
    flows += [
        (
            administrator.post(
                reverse("runs:project-members", args=[project.slug]), {"username": "nobody", "role": "viewer"}
            ),
            "ユーザー 'nobody' は存在しません",
        ),
        (
            administrator.post(reverse("runs:member-remove", args=[project.slug, admin.username])),
            "プロジェクトには管理者が少なくとも1人必要です",
        ),
    ]
    for response, message in flows:
        html = unescape(response.content.decode())
        assert message in html, message
        assert english_left(html, {failed_job.run.name, project.name, admin.username, "nobody"}) == []
