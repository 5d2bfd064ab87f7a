"""Every page the browser suite visits, walked once in Chromium (docs/design/interfaces.md#page-security): each answer
carries the Content-Security-Policy (no 'unsafe-inline', no 'unsafe-eval') and the Permissions-Policy, and the
browser reports no violation of either: no blocked script, style, image or connection, no refused form, no
feature the Permissions-Policy names that Chromium does not know. The pages of the other browser tests, the
Django admin, the browsable API and Swagger UI included; a live page's htmx refresh too.

Violations are heard twice: Chromium's own console line ("... violates the following Content Security Policy
directive ...") and a ``securitypolicyviolation`` listener added before any page script runs. The walk first
checks that an inline script is refused and heard, so a silent walk means a clean one.
"""

import io
import os
import re
from collections import defaultdict

import pytest
from playwright.sync_api import expect

from alerts.models import Channel
from checkpoints import services as checkpoint_services
from jobs import services as job_services
from jobs.models import Queue
from mlflow_api.registry import services as registry
from runs.metrics import metrics_ingest
from runs.models import Role, RunStatus
from sweeps.services import sweep_claim, sweep_create
from tests.alerts.history import seed_history
from tests.checkpoints.checkpoint_helpers import declaration, make_tar
from tests.e2e.helpers import log_in
from tests.e2e.test_resume_page import _failed_job
from tests.e2e.test_sweep_pages import GRID, _run_trial
from tests.factories import CodeVersionFactory, MembershipFactory, RunFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Before any page script: each violation is also written to the console, tagged.
HEAR_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => console.error(
  `csp-violation: ${event.violatedDirective} refused ${event.blockedURI || "inline"}`
  + ` in ${event.sourceFile}:${event.lineNumber}`
));
"""
# What Chromium writes for a refused load or inline code, an unknown Permissions-Policy feature, and our listener.
HEARD = re.compile(r"Content Security Policy|Permissions-Policy|csp-violation:")
# Added by hand to the login page: the policy must refuse it.
INLINE_SCRIPT = (
    "() => { const s = document.createElement('script'); s.textContent = 'window.ran = 1'; document.head.append(s); }"
)
# One task turn: a violation event queued while the page loaded has been dispatched (and written) after it.
TASK_TURN = "() => new Promise((resolve) => setTimeout(resolve))"


def _world():
    """The Project ``vision`` with what each page shows: a failed Job with checkpoints (carol's), a running Job, a
    checkpoint registered as a model version, a sweep with two finished trials, an alert channel, a reliability
    history; ``ada`` is a superuser and the Project's admin. Returns the objects the page addresses need."""
    failed = _failed_job()
    project, carol = failed.run.project, failed.created_by
    ada = UserFactory(username="ada", is_staff=True, is_superuser=True)
    MembershipFactory(user=ada, project=project, role=Role.ADMIN)
    running = job_services.job_launch(
        actor=ada,
        code_version=CodeVersionFactory(code__project=project, code__created_by=ada, code__name="live", version=1),
        queue=Queue.objects.get(name="cpu"),
        parameters={},
        dataset_version_ids=[],
        name="live",
    )
    job_services.job_claim(job_id=running.pk, worker_host="gpu-node-1")
    metrics_ingest(
        actor=ada, run=running.run, points=[{"key": "loss", "value": 1 / (s + 1), "step": s} for s in range(9)]
    )
    model_run = RunFactory(project=project, created_by=ada, name="resnet")
    files = {"model.pt": os.urandom(4096)}
    tar = make_tar(files)
    checkpoint, _ = checkpoint_services.checkpoint_register(actor=ada, run=model_run, step=100, framework="torch")
    checkpoint_services.checkpoint_upload(
        actor=ada, checkpoint=checkpoint, source=io.BytesIO(tar), expected_size=len(tar)
    )
    checkpoint_services.checkpoint_complete(actor=ada, checkpoint=checkpoint, **declaration(tar, files))
    version = registry.checkpoint_register(actor=ada, checkpoint=checkpoint, name="resnet")
    sweep = sweep_create(actor=carol, project=project, config=GRID)
    for losses in ([0.9, 0.4], [0.8, 0.2]):  # two trials with the metric: the scatter plots are drawn
        _run_trial(carol, sweep_claim(actor=carol, sweep=sweep).trial, losses=losses, end=RunStatus.FINISHED)
    Channel.objects.create(
        project=project, name="oncall", kind="webhook", target="https://example.org/h", created_by=ada
    )
    seed_history(project, carol)
    return {
        "failed": failed,
        "running": running,
        "checkpoint": failed.run.checkpoints.get(step=20),
        "model": version.registered_model,
        "sweep": sweep,
        "ada": ada,
    }


def _pages(world) -> list[tuple[str, str | None]]:
    """(path, a selector shown once the page's scripts have drawn it, or None) for ada, signed in."""
    failed, checkpoint, ada = world["failed"], world["checkpoint"], world["ada"]
    run, other = failed.run, world["running"].run
    return [
        ("/", None),
        ("/projects/vision/", "table.runs"),
        (f"/projects/vision/compare/?run={run.pk}&run={other.pk}", "figure.metric-chart .uplot"),
        (f"/runs/{run.pk}/", "figure.metric-chart .uplot"),
        (f"/runs/{run.pk}/system/", None),
        (f"/runs/{run.pk}/checkpoints/?older=1", None),
        (f"/runs/{run.pk}/artifacts/", None),
        (f"/runs/{run.pk}/logs/", None),
        (f"/runs/{run.pk}/data-history/", None),
        (f"/checkpoints/{checkpoint.pk}/", None),
        (f"/checkpoints/{checkpoint.pk}/resume/", None),
        (f"/checkpoints/{checkpoint.pk}/continue/", None),
        (f"/checkpoints/{checkpoint.pk}/delete/", None),
        (f"/checkpoints/{checkpoint.pk}/register/", None),
        ("/projects/vision/jobs/", None),
        ("/projects/vision/jobs/new/", None),
        (f"/jobs/{failed.pk}/", None),
        ("/projects/vision/models/", None),
        (f"/models/{world['model'].pk}/", None),
        ("/projects/vision/sweeps/", None),
        ("/projects/vision/sweeps/new/", None),
        (f"/sweeps/{world['sweep'].pk}/", 'figure.sweep-scatter[data-drawn="2"]'),
        ("/projects/vision/alerts/", None),
        ("/projects/vision/reliability/", "figure.reliability-chart[data-drawn] canvas"),
        ("/projects/vision/storage/", None),
        ("/projects/vision/members/", None),
        ("/projects/vision/audit/", None),
        ("/accounts/tokens/", None),
        ("/api/v1/docs/", ".swagger-ui .opblock"),
        ("/api/v1/", ".response-info"),
        ("/api/v1/projects/", ".response-info"),
        (f"/api/v1/runs/{run.pk}/", ".response-info"),
        ("/admin/", "#content"),
        ("/admin/runs/run/", "#result_list"),
        (f"/admin/runs/run/{run.pk}/change/", "#run_form"),
        (f"/admin/auth/user/{ada.pk}/change/", "#user_form"),
        ("/admin/auth/user/add/", "#user_form"),
    ]


def test_every_page_carries_both_policies_and_chromium_reports_no_violation(browser_page):
    page = browser_page
    world = _world()
    heard = defaultdict(list)  # path -> what the browser said about the policies there
    errors = defaultdict(list)  # path -> uncaught script errors (a script the policy broke without a report)
    here = {"path": "(before the first page)"}
    page.add_init_script(HEAR_VIOLATIONS)

    def listen(message) -> None:
        if HEARD.search(message.text):
            heard[here["path"]].append(message.text)

    page.on("console", listen)
    page.on("pageerror", lambda error: errors[here["path"]].append(str(error)))

    def visit(path: str, ready: str | None = None, status: int = 200) -> None:
        here["path"] = path
        response = page.goto(path)
        assert response.status == status, path
        _assert_policies(response.all_headers(), path)
        if ready:
            expect(page.locator(ready).first).to_be_attached(timeout=30_000)  # a loaded machine draws slowly
        page.evaluate(TASK_TURN)

    # The premise: an inline script is refused and the refusal is heard.
    visit("/accounts/login/")
    with page.expect_console_message(lambda message: "csp-violation: script-src" in message.text):
        page.evaluate(INLINE_SCRIPT)
    assert page.evaluate("() => window.ran") is None
    page.evaluate(TASK_TURN)
    heard.clear()

    visit("/accounts/login/")
    visit("/admin/login/")
    visit("/no-such-page/", status=404)
    here["path"] = "the login form's POST"
    log_in(page, "ada", "/projects/vision/")
    expect(page).to_have_url(re.compile(r"/projects/vision/$"))
    for path, ready in _pages(world):
        visit(path, ready)

    # A live page refreshes its part through htmx (every 3 s): the swapped answer is under the policy too.
    live = f"/jobs/{world['running'].pk}/"
    visit(live, "#job-live[hx-get]")
    page.evaluate("() => document.body.addEventListener('htmx:afterSettle', () => { window.settled = true; })")
    with page.expect_response(lambda response: f"{live}live/" in response.url) as refreshed:
        page.wait_for_function("() => window.settled")
    _assert_policies(refreshed.value.all_headers(), f"{live}live/")
    page.evaluate(TASK_TURN)

    here["path"] = "the logout form's POST"
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    page.evaluate(TASK_TURN)
    assert dict(heard) == {}
    assert dict(errors) == {}


def _assert_policies(headers: dict, path: str) -> None:
    policy = headers.get("content-security-policy", "")
    assert "script-src 'self'" in policy and "default-src 'self'" in policy, (path, policy)
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, (path, policy)
    assert "camera=()" in headers.get("permissions-policy", ""), (path, headers.get("permissions-policy"))
