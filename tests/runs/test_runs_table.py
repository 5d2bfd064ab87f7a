"""The runs table (project page) and the Compare page: columns, sort, search, CSV, selection
(docs/design/interfaces.md#workspace)."""

import csv
import io

import pytest
from django.urls import reverse

from runs import table
from runs.metrics import metrics_ingest
from runs.models import RunStatus, RunTag
from tests.chart_helpers import chart_data
from tests.factories import RunFactory


@pytest.fixture
def three(project, creator):
    """Three runs: lr 0.1 / 0.01 / 0.001 (batch 32 in all), loss ending at 0.3 / 0.1 / 0.2."""
    runs = []
    for index, (lr, loss) in enumerate([(0.1, 0.3), (0.01, 0.1), (0.001, 0.2)]):
        run = RunFactory(
            project=project,
            created_by=creator,
            name=f"run-{index}",
            parameters={"lr": lr, "batch": 32, "opt": "adam" if index else "sgd"},
            status=RunStatus.FINISHED if index < 2 else RunStatus.RUNNING,
        )
        metrics_ingest(
            actor=creator,
            run=run,
            points=[{"key": "loss", "value": loss + (9 - s) / 10, "step": s} for s in range(10)]
            + [{"key": "acc", "value": 0.5, "step": 9}],
        )
        runs.append(run)
    return runs


def page(client, project, **params):
    return client.get(reverse("runs:project-detail", args=[project.slug]), params)


def names(response) -> list[str]:
    return [row.name for row in response.context["page_obj"]]


def test_default_columns_are_the_varying_parameters_and_shared_metrics(login, viewer, project, three):
    response = page(login(viewer), project)
    assert [c.id for c in response.context["columns"]] == [
        "param:lr",
        "param:opt",
        "metric:acc:last",
        "metric:loss:last",
    ]
    body = response.content.decode()
    assert 'data-column="param:batch"' not in body  # the same in every run
    assert 'data-column="metric:loss:last">0.1<' in body


def test_sorting_by_a_metric_column_orders_the_runs_by_its_value(login, viewer, project, three):
    client = login(viewer)
    assert names(page(client, project, sort="metric:loss:last")) == ["run-1", "run-2", "run-0"]
    assert names(page(client, project, sort="-metric:loss:min")) == ["run-0", "run-2", "run-1"]
    assert names(page(client, project, sort="param:lr")) == ["run-2", "run-1", "run-0"]
    response = page(client, project, sort="nope")
    assert response.status_code == 400 and "cannot sort by" in response.content.decode()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("lr>0.005", ["run-1", "run-0"]),
        ("lr>0.005 and status=finished", ["run-1", "run-0"]),
        ("lr<=0.01 AND status!=finished", ["run-2"]),
        ("opt=adam", ["run-2", "run-1"]),
        ("opt~AD", ["run-2", "run-1"]),
        ("run-1", ["run-1"]),
        ("sgd", ["run-0"]),
        ("creator=carol-creator and name~run-0", ["run-0"]),
    ],
)
def test_the_search_language_filters_runs(login, viewer, project, three, query, expected):
    assert names(page(login(viewer), project, q=query)) == expected


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("lr>", "no value after"),
        ("status>finished", "status is text"),
        ("lr>0.1 and and x=1", "write FIELD OP VALUE"),
        ("=5", "write FIELD OP VALUE"),
        ("tag>x", "tags take = or !="),
    ],
)
def test_a_bad_search_says_which_term_and_why(login, viewer, project, three, query, message):
    response = page(login(viewer), project, q=query)
    assert response.status_code == 400 and message in response.content.decode()


def test_filters_by_creator_and_tag(login, viewer, project, three):
    RunTag.objects.create(run=three[1], key="team", value="vision")
    client = login(viewer)
    assert names(page(client, project, tag="team:vision")) == ["run-1"]
    assert names(page(client, project, q="tag=team")) == ["run-1"]
    assert names(page(client, project, creator="nobody")) == []


def test_chosen_columns_show_min_and_max_and_bad_ones_are_refused(login, viewer, project, three):
    client = login(viewer)
    response = page(client, project, col=["metric:loss:min", "metric:loss:max", "param:batch"])
    body = response.content.decode()
    assert 'data-column="metric:loss:max">1.2<' in body and 'data-column="param:batch">32<' in body
    bad = page(client, project, col="metric:loss:median")
    assert bad.status_code == 400 and "last, min, max" in bad.content.decode()


def test_csv_export_has_every_matching_run_with_the_columns(login, viewer, project, three):
    response = login(viewer).get(
        reverse("runs:project-runs-csv", args=[project.slug]),
        {"sort": "metric:loss:last", "col": ["param:lr", "metric:loss:last"]},
    )
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == ["id", "name", "status", "kind", "creator", "started_at", "lr", "loss (last)"]
    assert [(r[1], r[6], r[7]) for r in rows[1:]] == [
        ("run-1", "0.01", "0.1"),
        ("run-2", "0.001", "0.2"),
        ("run-0", "0.1", "0.3"),
    ]


def test_the_table_has_a_checkbox_per_run_and_a_compare_button(login, viewer, project, three):
    body = page(login(viewer), project).content.decode()
    assert body.count('type="checkbox" name="run"') == 3
    assert reverse("runs:project-compare", args=[project.slug]) in body


def test_parse_columns_refuses_hostile_values():
    with pytest.raises(Exception, match="param:NAME"):
        table.parse_columns(["'; drop table runs; --"])
    assert [c.id for c in table.parse_columns(["param:a", "param:a", "metric:x:y:last"])] == [
        "param:a",
        "metric:x:y:last",
    ]


# --- Compare -----------------------------------------------------------------------------------------------


def compare(client, project, ids, **params):
    return client.get(reverse("runs:project-compare", args=[project.slug]), {"run": ids, **params})


def test_compare_overlays_every_metric_and_diffs_the_parameters(login, viewer, project, three):
    response = compare(login(viewer), project, [r.pk for r in three])
    body = response.content.decode()
    data = chart_data(body)
    assert [c["key"] for c in data["charts"]] == ["acc", "loss"]
    assert [s["run"] for s in data["charts"][1]["series"]] == [r.pk for r in three]
    assert 'data-parameter="lr"' in body and 'data-parameter="opt"' in body
    assert 'data-parameter="batch"' not in body and "1 is the same in all" in body
    everything = compare(login(viewer), project, [r.pk for r in three], all="1").content.decode()
    assert 'data-parameter="batch"' in everything


def test_compare_of_another_projects_run_is_404_and_a_bad_selection_400(login, viewer, outsider, project, three):
    assert compare(login(outsider), project, [three[0].pk]).status_code == 404
    assert compare(login(viewer), project, ["1x"]).status_code == 400
    assert compare(login(viewer), project, [",".join(str(i) for i in range(1, 60))]).status_code == 400  # over 50
    assert "No runs selected" in compare(login(viewer), project, []).content.decode()


# --- remembered columns -----------------------------------------------------------------------------------


def test_a_users_column_choice_is_remembered_per_user_and_reset(login, viewer, creator, project, three):
    client = login(viewer)
    url = reverse("runs:project-columns", args=[project.slug])
    response = client.post(url, {"col": ["metric:loss:min", "param:batch"], "action": "save", "q": "lr>0.005"})
    assert response.status_code == 302 and response["Location"].endswith("?q=lr%3E0.005")
    client.post(url, {"col": ["metric:loss:min", "param:batch"], "action": "save"})  # a double click
    assert [c.id for c in page(client, project).context["columns"]] == ["metric:loss:min", "param:batch"]
    assert [c.id for c in page(client, project, col="param:lr").context["columns"]] == ["param:lr"]  # a link wins
    others = page(login(creator), project).context["columns"]
    assert [c.id for c in others][0] == "param:lr"  # another user still sees the defaults
    client.post(url, {"action": "reset"})
    assert [c.id for c in page(client, project).context["columns"]][0] == "param:lr"


def test_a_bad_column_choice_is_refused_and_the_saved_one_kept(login, viewer, project, three):
    client = login(viewer)
    url = reverse("runs:project-columns", args=[project.slug])
    client.post(url, {"col": ["param:lr"], "action": "save"})
    response = client.post(url, {"col": ["metric:loss:p99"], "action": "save"}, follow=True)
    assert "last, min, max" in response.content.decode()
    assert [c.id for c in response.context["columns"]] == ["param:lr"]


def test_an_outsider_cannot_save_columns_in_another_project(login, outsider, project):
    response = login(outsider).post(reverse("runs:project-columns", args=[project.slug]), {"col": ["param:lr"]})
    assert response.status_code == 404


def test_the_workspace_pages_are_translated_to_japanese(login, viewer, project, three, settings):
    client = login(viewer)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    table_page = page(client, project).content.decode()
    assert "選んだRunを比較" in table_page and "CSV をダウンロード" in table_page and "3 件のRun" in table_page
    compared = compare(client, project, [r.pk for r in three]).content.decode()
    assert "Runの比較" in compared and "拡大を戻す" in compared and "対数目盛り (y)" in compared


def test_sorting_by_a_metric_puts_runs_without_it_last_either_way_and_keeps_filters(
    login, viewer, project, three, creator
):
    RunFactory(project=project, created_by=creator, name="no-loss", parameters={"lr": 0.5})
    RunTag.objects.create(run=three[0], key="team", value="vision")
    RunTag.objects.create(run=three[2], key="team", value="vision")
    client = login(viewer)
    assert names(page(client, project, sort="metric:loss:last")) == ["run-1", "run-2", "run-0", "no-loss"]
    assert names(page(client, project, sort="-metric:loss:last")) == ["run-0", "run-2", "run-1", "no-loss"]
    assert names(page(client, project, sort="-metric:loss:max", q="tag=team")) == ["run-0", "run-2"]
    rows = page(client, project, sort="metric:loss:last", col=["metric:loss:last"]).context["page_obj"]
    assert [row.col0 for row in rows][:3] == pytest.approx([0.1, 0.2, 0.3]) and rows[3].col0 is None


def test_compare_lists_each_runs_checkpoints_and_stages_in_the_same_queries_for_more_runs(
    login, viewer, project, creator, django_assert_max_num_queries
):
    from checkpoints.models import Checkpoint
    from runs.models import DataStage

    runs = [RunFactory(project=project, created_by=creator, name=f"r{i}") for i in range(6)]
    for index, run in enumerate(runs):
        metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": 1.0, "step": 0}])
        Checkpoint.objects.create(run=run, step=10 + index, state="complete", file_count=1, total_bytes=10)
        Checkpoint.objects.create(run=run, step=99, state="error", file_count=1, total_bytes=10)
    DataStage.objects.create(run=runs[4], start_step=5, created_by=creator)
    client = login(viewer)
    compare(client, project, [runs[0].pk])  # session and caches warmed
    with django_assert_max_num_queries(16):  # not one or more per Run
        body = compare(client, project, [r.pk for r in runs]).content.decode()
    for index in range(6):
        assert f"step {10 + index}<" in body
    assert "step 99<" not in body and "from step 5" in body and body.count("No data changes") == 5


def test_every_run_shows_once_across_pages_in_the_sorts_order_with_its_columns(login, viewer, project, creator):
    losses = {f"run-{index:02d}": (index * 7) % 31 / 10 for index in range(30)}  # 30 distinct values, shuffled
    for name, loss in losses.items():
        run = RunFactory(project=project, created_by=creator, name=name, parameters={"lr": loss})
        metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": loss, "step": 1}])
        if loss > 1:
            RunTag.objects.create(run=run, key="team", value="vision")
    client = login(viewer)
    for params, expected in [
        ({"sort": "-metric:loss:last"}, sorted(losses, key=losses.get, reverse=True)),
        ({"sort": "param:lr", "q": "tag=team"}, sorted((n for n in losses if losses[n] > 1), key=losses.get)),
        ({"q": "run-0"}, [f"run-{index:02d}" for index in range(9, -1, -1)]),
    ]:
        shown, number = [], 1
        while number:
            page_obj = page(client, project, page=number, col=["metric:loss:last"], **params).context["page_obj"]
            shown += [(row.name, row.col0) for row in page_obj]
            number = page_obj.next_page_number() if page_obj.has_next() else 0
        assert [name for name, _ in shown] == expected  # the second page repeats nothing, misses nothing
        assert [value for _, value in shown] == pytest.approx([losses[name] for name in expected])
