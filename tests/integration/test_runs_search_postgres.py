"""The runs table's search on PostgreSQL (docs/workspace.md; runs/migrations/0022): each word is looked up
through the trigram indexes of the name, the run id and the parameters' text, never by reading every Run of the
Project, and finds what it found before: a run by any part of its name, id or parameters, in any case."""

from django.db import connection, transaction

from runs.models import Run
from runs.table import run_table_for_user, runs_table
from tests.factories import RunFactory


def _search(user, project, text: str):
    rows, _columns, _choices = run_table_for_user(user=user, project=project, filters={"q": text}, column_ids=[])
    return rows


def test_a_search_word_is_found_through_the_trigram_indexes(postgres, project, creator):
    RunFactory(project=project, created_by=creator, name="ResNet-50 warmup", parameters={"optimizer": "AdamW"})
    RunFactory(project=project, created_by=creator, name="vit-base", parameters={"optimizer": "sgd"})
    target = RunFactory(project=project, created_by=creator, name="bert", external_id="xk9-run-77")
    assert [r.name for r in _search(creator, project, "resnet")] == ["ResNet-50 warmup"]
    assert [r.name for r in _search(creator, project, "adamw")] == ["ResNet-50 warmup"]
    assert [r.pk for r in _search(creator, project, "K9-RUN")] == [target.pk]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'run_search_%%' ORDER BY 1")
        assert [name for (name,) in cursor.fetchall()] == [
            "run_search_external_id_trgm",
            "run_search_name_trgm",
            "run_search_parameters_trgm",
        ]
        # A few runs fit one page, where reading them all costs least: rule out the plain scans to see that the
        # search's expressions match the indexes (a search changed to another expression would no longer use them).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        plan = runs_table(runs=Run.objects.all(), columns=[], search="warmup").explain()
    used = {name for name in ("name", "external_id", "parameters") if f"run_search_{name}_trgm" in plan}
    assert used == {"name", "external_id", "parameters"}, plan
    assert [r.name for r in _search(creator, project, "warmup")] == ["ResNet-50 warmup"]
