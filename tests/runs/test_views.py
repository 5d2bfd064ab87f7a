"""Pages: project list, project Runs table, Run page, charts partial, members page, language
(docs/design/resume.md#steps-continue; docs/design/interfaces.md#surfaces)."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from runs import charts
from runs.metrics import metrics_ingest
from runs.models import Membership, Role, RunKind, RunStatus
from tests.chart_helpers import chart_data
from tests.factories import (
    CodeVersionFactory,
    DatasetFactory,
    DatasetVersionFactory,
    MembershipFactory,
    RunFactory,
    UserFactory,
)

# --- access --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("runs:project-list", {}),
        ("runs:project-detail", {"slug": "vision"}),
        ("runs:project-members", {"slug": "vision"}),
        ("runs:run-detail", "run"),
        ("runs:run-charts", "run"),
        ("runs:run-logs", "run"),
        ("runs:run-system", "run"),
        ("runs:project-compare", {"slug": "vision"}),
        ("runs:project-runs-csv", {"slug": "vision"}),
    ],
)
def test_anonymous_is_redirected_to_login(client, run, name, kwargs):
    url = reverse(name, kwargs={"pk": run.pk} if kwargs == "run" else kwargs)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


@pytest.mark.parametrize("role", ["admin", "member", "viewer"])
def test_every_role_sees_the_project_and_run_pages(login, request, run, role):
    client = login(request.getfixturevalue(role))
    assert client.get(reverse("runs:project-list")).status_code == 200
    assert client.get(reverse("runs:project-detail", args=["vision"])).status_code == 200
    for name in ("run-detail", "run-charts", "run-checkpoints", "run-data-history", "run-logs", "run-system"):
        assert client.get(reverse(f"runs:{name}", args=[run.pk])).status_code == 200, name


def test_outsider_gets_404_for_another_projects_pages(login, outsider, run):
    client = login(outsider)
    urls = [
        reverse("runs:project-detail", args=["vision"]),
        reverse("runs:project-members", args=["vision"]),
        reverse("runs:run-detail", args=[run.pk]),
        reverse("runs:run-charts", args=[run.pk]),
        reverse("runs:run-checkpoints", args=[run.pk]),
        reverse("runs:run-system", args=[run.pk]),
        reverse("runs:project-compare", args=["vision"]),
        reverse("runs:project-runs-csv", args=["vision"]),
    ]
    for url in urls:
        assert client.get(url).status_code == 404, url
    response = client.post(reverse("runs:member-remove", args=["vision", "carol-creator"]))
    assert response.status_code == 404
    assert Membership.objects.filter(user__username="carol-creator").exists()


def test_project_list_shows_only_the_users_projects_with_role(login, viewer, project, outsider):
    response = login(viewer).get(reverse("runs:project-list"))
    body = response.content.decode()
    assert "Vision" in body and "viewer" in body
    assert "Other" not in body


def test_login_page_logs_in_and_logout_logs_out(client, member):
    response = client.get(reverse("login"))
    assert response.status_code == 200 and 'name="username"' in response.content.decode()
    response = client.post(reverse("login"), {"username": "mike-member", "password": "pw-123456"})
    assert response.status_code == 302 and response["Location"] == reverse("runs:project-list")
    assert client.get(reverse("runs:project-list")).status_code == 200
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("runs:project-list")).status_code == 302


def test_wrong_password_shows_a_form_error(client, member):
    response = client.post(reverse("login"), {"username": "mike-member", "password": "nope"})
    assert response.status_code == 200
    assert "errorlist" in response.content.decode()


# --- project page: runs table, filters, pagination -------------------------------


def test_runs_table_lists_runs_with_status_kind_creator_and_duration(login, member, project, creator):
    started = timezone.now() - timedelta(minutes=5)
    RunFactory(
        project=project,
        created_by=creator,
        name="long-one",
        status=RunStatus.FINISHED,
        kind=RunKind.FINE_TUNING,
        started_at=started,
        ended_at=started + timedelta(minutes=3, seconds=7),
    )
    body = login(member).get(reverse("runs:project-detail", args=["vision"])).content.decode()
    assert "long-one" in body
    assert 'data-status="finished"' in body
    assert "fine-tuning" in body
    assert "carol-creator" in body
    assert "3m 07s" in body


def test_a_running_runs_duration_counts_up_to_now(login, member, project, creator):
    RunFactory(
        project=project,
        created_by=creator,
        status=RunStatus.RUNNING,
        started_at=timezone.now() - timedelta(hours=2, minutes=5, seconds=10),
    )
    body = login(member).get(reverse("runs:project-detail", args=["vision"])).content.decode()
    assert "2h 05m" in body


def test_runs_table_filters_by_status_and_kind(login, member, project, creator):
    RunFactory(project=project, created_by=creator, name="run-a", status=RunStatus.FAILED, kind=RunKind.TRAINING)
    RunFactory(project=project, created_by=creator, name="run-b", status=RunStatus.FAILED, kind=RunKind.EVALUATION)
    RunFactory(project=project, created_by=creator, name="run-c", status=RunStatus.RUNNING, kind=RunKind.TRAINING)
    client = login(member)
    url = reverse("runs:project-detail", args=["vision"])
    body = client.get(url, {"status": "failed"}).content.decode()
    assert "run-a" in body and "run-b" in body and "run-c" not in body
    body = client.get(url, {"status": "failed", "kind": "training"}).content.decode()
    assert "run-a" in body and "run-b" not in body and "run-c" not in body
    body = client.get(url, {"status": "", "kind": ""}).content.decode()
    assert "run-a" in body and "run-b" in body and "run-c" in body


def test_an_unknown_filter_value_is_a_form_error(login, member, run):
    response = login(member).get(reverse("runs:project-detail", args=["vision"]), {"status": "exploded"})
    assert response.status_code == 400
    assert "errorlist" in response.content.decode()
    assert "baseline" not in response.content.decode()


def test_runs_table_is_paginated_by_25_keeping_filters(login, member, project, creator):
    for index in range(30):
        RunFactory(project=project, created_by=creator, name=f"paged-{index:02d}", status=RunStatus.FINISHED)
    RunFactory(project=project, created_by=creator, name="still-running", status=RunStatus.RUNNING)
    client = login(member)
    url = reverse("runs:project-detail", args=["vision"])
    first = client.get(url, {"status": "finished"})
    assert len(first.context["page_obj"].object_list) == 25
    assert first.context["page_obj"].paginator.num_pages == 2
    assert "status=finished&amp;page=2" in first.content.decode()
    second = client.get(url, {"status": "finished", "page": 2})
    assert len(second.context["page_obj"].object_list) == 5
    assert "still-running" not in second.content.decode()


def test_runs_of_another_project_never_appear(login, member, project, other_project):
    RunFactory(project=other_project, name="secret-run")
    body = login(member).get(reverse("runs:project-detail", args=["vision"])).content.decode()
    assert "secret-run" not in body


# --- run page ---------------------------------------------------------------------


def test_run_page_shows_overview_lineage_parameters_datasets_and_code(login, viewer, project, creator):
    dataset = DatasetFactory(project=project, name="digits")
    version = DatasetVersionFactory(dataset=dataset, version="v3", uri="s3://bucket/digits-v3")
    code_version = CodeVersionFactory(code__project=project, code__name="trainer", code__created_by=creator)
    parent = RunFactory(project=project, created_by=creator, name="the-parent")
    run = RunFactory(
        project=project,
        created_by=creator,
        name="the-child",
        parent=parent,
        code_version=code_version,
        parameters={"lr": 0.001, "layers": [64, 32], "optimizer": "adam"},
        external_id="abc12345",
    )
    run.input_dataset_versions.set([version])
    RunFactory(project=project, created_by=creator, name="the-grandchild", parent=run)

    body = login(viewer).get(reverse("runs:run-detail", args=[run.pk])).content.decode()
    assert "abc12345" in body
    assert reverse("runs:run-detail", args=[parent.pk]) in body and "the-parent" in body
    assert "the-grandchild" in body
    assert "lr" in body and "0.001" in body and "[64, 32]" in body and "adam" in body
    assert "digits" in body and "v3" in body and "s3://bucket/digits-v3" in body
    assert "trainer v" in body
    for tab in ("Overview", "Checkpoints", "Training data history", "Logs"):
        assert tab in body


@pytest.mark.parametrize(
    "name, sentence",
    [
        ("runs:run-checkpoints", "No checkpoints to show yet"),
        ("runs:run-data-history", "No data changes have been recorded"),
        ("runs:run-logs", "No logs yet"),
        ("runs:run-system", "No system metrics were recorded"),
    ],
)
def test_later_tabs_show_an_empty_state_sentence(login, viewer, run, name, sentence):
    response = login(viewer).get(reverse(name, args=[run.pk]))
    assert sentence in response.content.decode()
    assert 'aria-current="page"' in response.content.decode()


def test_run_page_sends_one_uplot_chart_per_metric_key(login, viewer, run, creator):
    points = [{"key": key, "value": 1.0 / (s + 1), "step": s} for key in ("loss", "acc") for s in range(20)]
    metrics_ingest(actor=creator, run=run, points=points)
    body = login(viewer).get(reverse("runs:run-detail", args=[run.pk])).content.decode()
    assert body.count('<figure class="metric-chart"') == 2
    assert 'data-key="loss"' in body and 'data-key="acc"' in body
    assert "uPlot.iife.min.js" in body and "charts.js" in body and "<svg" not in body
    data = chart_data(body)
    assert [c["key"] for c in data["charts"]] == ["acc", "loss"]
    (series,) = data["charts"][1]["series"]
    assert series["run"] == run.pk and series["x"] == list(range(20)) and series["y"][1] == 0.5
    assert len(series["t"]) == 20


def test_non_finite_points_are_skipped_and_counted(login, viewer, run, creator):
    metrics_ingest(
        actor=creator,
        run=run,
        points=[
            {"key": "loss", "value": 1.0, "step": 0},
            {"key": "loss", "value": "NaN", "step": 1},
            {"key": "loss", "value": "Infinity", "step": 2},
            {"key": "loss", "value": 0.5, "step": 3},
        ],
    )
    body = login(viewer).get(reverse("runs:run-detail", args=[run.pk])).content.decode()
    assert 'data-skipped="2"' in body
    assert "2 non-finite values" in body
    (series,) = chart_data(body)["charts"][0]["series"]
    assert series["x"] == [0, 3] and series["y"] == [1.0, 0.5]


def test_system_metrics_are_on_the_system_tab_not_among_the_training_charts(login, viewer, run, creator):
    metrics_ingest(
        actor=creator,
        run=run,
        points=[{"key": key, "value": 1.0, "step": s} for key in ("loss", "system/cpu_percent") for s in range(3)],
    )
    client = login(viewer)
    overview = chart_data(client.get(reverse("runs:run-detail", args=[run.pk])).content.decode())
    assert [c["key"] for c in overview["charts"]] == ["loss"]
    system = client.get(reverse("runs:run-system", args=[run.pk])).content.decode()
    assert [c["key"] for c in chart_data(system)["charts"]] == ["system/cpu_percent"]
    assert f'hx-get="{reverse("runs:run-charts", args=[run.pk])}?system=1"' in system
    partial = client.get(reverse("runs:run-charts", args=[run.pk]) + "?system=1").content.decode()
    assert [c["key"] for c in chart_data(partial)["charts"]] == ["system/cpu_percent"]


def test_a_run_without_metrics_says_so(login, viewer, run):
    body = login(viewer).get(reverse("runs:run-detail", args=[run.pk])).content.decode()
    assert "No metrics have been logged" in body


def test_charts_partial_polls_while_running_and_stops_when_final(login, viewer, run, creator):
    client = login(viewer)
    url = reverse("runs:run-charts", args=[run.pk])
    live = client.get(url).content.decode()
    assert f'hx-get="{url}"' in live and 'hx-trigger="every 5s"' in live
    assert "<html" not in live
    run.status = RunStatus.FINISHED
    run.save(update_fields=["status"])
    final = client.get(url).content.decode()
    assert "hx-get" not in final and "hx-trigger" not in final
    assert "hx-get" not in client.get(reverse("runs:run-detail", args=[run.pk])).content.decode()


def test_pages_work_without_htmx_installed(login, viewer, run, settings):
    settings.STATICFILES_DIRS = [settings.BASE_DIR / "static"]
    body = login(viewer).get(reverse("runs:run-detail", args=[run.pk])).content.decode()
    assert "htmx.min.js" not in body
    assert 'id="run-charts"' in body


# --- charts module ------------------------------------------------------------------


def test_many_points_are_downsampled_to_at_most_1000_keeping_the_spike(run, creator):
    points = [{"key": "loss", "value": 1.0, "step": s} for s in range(5000)]
    points[3333]["value"] = 50.0
    points += [{"key": "loss", "value": bad, "step": 5000} for bad in ("NaN", "Infinity", "-Infinity")]
    metrics_ingest(actor=creator, run=run, points=points)
    (chart,) = charts.run_charts(run=run)
    assert chart.total == 5003 and chart.skipped == 3
    assert 2 <= chart.drawn <= charts.MAX_POINTS and chart.downsampled
    (series,) = charts.chart_data([chart])["charts"][0]["series"]
    assert max(series["y"]) == 50.0 and series["x"] == sorted(series["x"])


def test_a_large_series_is_reduced_once_and_again_after_new_points(login, viewer, run, creator):
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": s} for s in range(3000)])
    client = login(viewer)
    url = reverse("runs:run-charts", args=[run.pk])
    first = chart_data(client.get(url).content.decode())["charts"][0]["series"][0]
    assert chart_data(client.get(url).content.decode())["charts"][0]["series"][0] == first
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 99.0, "step": 3000}])
    latest = chart_data(client.get(url).content.decode())["charts"][0]["series"][0]
    assert max(first["y"]) == 1.0 and max(latest["y"]) == 99.0 and latest["x"][-1] == 3000


def test_a_hostile_key_is_escaped_in_the_page(login, viewer, run, creator):
    metrics_ingest(actor=creator, run=run, points=[{"key": '</script><b>"x"</b>', "value": 1.0, "step": 0}])
    body = login(viewer).get(reverse("runs:run-detail", args=[run.pk])).content.decode()
    assert "<b>" not in body and "&lt;b&gt;" in body
    assert chart_data(body)["charts"][0]["key"] == '</script><b>"x"</b>'


# --- members page ----------------------------------------------------------------------


def test_admin_sees_members_and_non_admins_get_403(login, admin, member, viewer):
    url = reverse("runs:project-members", args=["vision"])
    body = login(admin).get(url).content.decode()
    assert "alice-admin" in body and "mike-member" in body and "vera-viewer" in body
    for user in (member, viewer):
        assert login(user).get(url).status_code == 403
        response = login(user).post(url, {"username": "vera-viewer", "role": "admin"})
        assert response.status_code == 403
    assert Membership.objects.get(user=viewer).role == Role.VIEWER


def test_non_admin_cannot_change_or_remove_members(login, admin, member):
    client = login(member)
    response = client.post(reverse("runs:member-role", args=["vision", "alice-admin"]), {"role": "viewer"})
    assert response.status_code == 403
    assert client.post(reverse("runs:member-remove", args=["vision", "alice-admin"])).status_code == 403
    assert Membership.objects.get(user=admin).role == Role.ADMIN


def test_admin_adds_a_member_by_username(login, admin, project):
    UserFactory(username="newbie")
    url = reverse("runs:project-members", args=["vision"])
    response = login(admin).post(url, {"username": "newbie", "role": "viewer"})
    assert response.status_code == 302
    assert Membership.objects.get(project=project, user__username="newbie").role == Role.VIEWER


@pytest.mark.parametrize(
    "username, role, message",
    [
        ("ghost", "member", "no user named"),
        ("mike-member", "member", "already a member"),
        ("mike-member", "owner", "Select a valid choice"),
    ],
)
def test_adding_a_bad_member_is_a_form_error(login, admin, member, username, role, message):
    response = login(admin).post(reverse("runs:project-members", args=["vision"]), {"username": username, "role": role})
    assert response.status_code in (400, 409)
    assert message in response.content.decode()
    assert Membership.objects.filter(project__slug="vision").count() == 2


def test_admin_changes_a_role_and_removes_a_member(login, admin, member, project):
    client = login(admin)
    response = client.post(reverse("runs:member-role", args=["vision", "mike-member"]), {"role": "admin"})
    assert response.status_code == 302
    assert Membership.objects.get(user=member).role == Role.ADMIN
    response = client.post(reverse("runs:member-remove", args=["vision", "mike-member"]))
    assert response.status_code == 302
    assert not Membership.objects.filter(user=member, project=project).exists()


def test_the_last_admin_can_be_neither_demoted_nor_removed(login, admin, member):
    client = login(admin)
    response = client.post(reverse("runs:member-role", args=["vision", "alice-admin"]), {"role": "member"})
    assert response.status_code == 409
    assert "at least one admin" in response.content.decode()
    response = client.post(reverse("runs:member-remove", args=["vision", "alice-admin"]))
    assert response.status_code == 409
    assert "at least one admin" in response.content.decode()
    assert Membership.objects.get(user=admin).role == Role.ADMIN


def test_an_admin_who_steps_down_is_sent_back_to_the_project(login, admin, project):
    MembershipFactory(project=project, user=UserFactory(username="second-admin"), role=Role.ADMIN)
    response = login(admin).post(reverse("runs:member-role", args=["vision", "alice-admin"]), {"role": "viewer"})
    assert response.status_code == 302
    assert response["Location"] == reverse("runs:project-detail", args=["vision"])


# --- language ----------------------------------------------------------------------------


def test_pages_render_in_japanese_after_set_language(login, viewer, run):
    client = login(viewer)
    response = client.post(reverse("set_language"), {"language": "ja", "next": reverse("runs:project-list")})
    assert response.status_code == 302
    body = client.get(reverse("runs:project-list")).content.decode()
    assert 'lang="ja"' in body
    assert "プロジェクト" in body and "ログアウト" in body and "閲覧者" in body
    body = client.get(reverse("runs:run-detail", args=[run.pk])).content.decode()
    assert "学習データの履歴" in body and "概要" in body
    client.post(reverse("set_language"), {"language": "en", "next": "/"})
    assert "Log out" in client.get(reverse("runs:project-list")).content.decode()
