"""The endpoint × role matrix (docs/design/runs.md#write-rule): every URL pattern × method × role answers as
``mado.policy_table`` says.

The patterns come from the URL conf itself, so a new pattern without a row in
the table fails ``test_every_url_pattern_has_a_row``. Each pattern is one test
that builds the world once and sends every method as every role; each request
runs in a savepoint that is rolled back, so every cell starts from the same
world. Bodies are valid for a writer, so a refusal shows as 401/403/404 and
not as a 400 on bad input. Every answer to an outsider is checked for names
it must not reveal (Project name and slug, Run name and id).
"""

import json
import re

import pytest
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from alerts.services.rules import channel_create, rule_create
from jobs.models import JobStatus, Queue
from jobs.services.lifecycle import job_claim, run_token_issue
from mado.tokens import api_token_create
from mlflow_api.registry import services as registry
from mlflow_api.tracking.logged_models import logged_model_create
from runs.models import RunStatus
from runs.resume import run_start
from runs.service_accounts import service_account_create, service_account_token_create
from runs.services import dataset_create, dataset_version_create
from sweeps.services import sweep_claim
from tests.factories import CodeVersionFactory, UserFactory, api_key
from tests.jobs.conftest import checkpoint, launch
from tests.policy_table import ROLES, ROWS
from tests.sweeps.sweep_helpers import make_sweep

ADMIN_SITE = "admin/"
ARTIFACT = b"hello"  # notes.txt of the Run; a writer's PUT sends the same bytes (a no-op, 200)


def url_patterns(resolver=None, prefix=""):
    """``(route, callback)`` of every URL pattern, nested includes flattened; Django's admin site is one row."""
    for pattern in (resolver or get_resolver()).url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if route == ADMIN_SITE:
                yield route, None
            else:
                yield from url_patterns(pattern, route)
        elif isinstance(pattern, URLPattern) and "format>" not in route:  # a row's ".json" twin answers alike
            yield route, pattern.callback


PATTERNS = dict(url_patterns())


def drf_methods(callback) -> set[str] | None:
    """The methods a DRF view answers (router actions or the handlers of an APIView); None for other views."""
    if getattr(callback, "actions", None):
        return {method.upper() for method in callback.actions}
    view_class = getattr(callback, "cls", None)
    if view_class is None:
        return None
    return {m.upper() for m in ("get", "post", "put", "patch", "delete") if hasattr(view_class, m)}


def test_every_url_pattern_has_a_row():
    assert sorted(set(PATTERNS) - set(ROWS)) == []
    assert sorted(set(ROWS) - set(PATTERNS)) == []


@pytest.mark.parametrize("route", sorted(r for r in PATTERNS if drf_methods(PATTERNS[r]) is not None))
def test_every_method_of_a_drf_view_has_answers(route):
    declared = set(ROWS[route])
    served = drf_methods(PATTERNS[route]) - {"OPTIONS", "HEAD"}
    if route.endswith("^artifacts/(?P<artifact_path>[\\s\\S]+)\\Z"):
        served -= {"POST"}
    assert declared == served


def test_every_row_names_every_role():
    assert [
        (route, method) for route, row in ROWS.items() for method, cell in row.items() if tuple(cell) != ROLES
    ] == []


@pytest.fixture
def world(db, project, other_project, creator, admin, member, viewer, outsider):
    """One Project with a running Job's Run (a checkpoint, an artifact, a data stage), another Run with its own
    Job, a Sweep, a Dataset; plus a superuser who is no member."""
    queue = Queue.objects.get_or_create(name="cpu")[0]
    code_version = CodeVersionFactory(code__project=project, code__created_by=creator, code__name="trainer", version=1)
    dataset = dataset_create(actor=creator, project=project, name="digits")
    version = dataset_version_create(actor=creator, dataset=dataset, version="v1", uri="s3://d/v1")
    job = launch(creator, code_version, queue, name="secret-run-name", dataset_version_ids=[version.pk])
    job_claim(job_id=job.pk, worker_host="gpu-1")
    other_job = launch(creator, code_version, queue, name="other")
    run = run_start(actor=creator, project=project, external_id=job.run.external_id, resume="allow").run
    job.refresh_from_db()
    assert (job.status, run.status) == (JobStatus.RUNNING, RunStatus.RUNNING)
    ckpt = checkpoint(run, 10)
    sweep = make_sweep(actor=creator, project=project)
    sweep_claim(actor=creator, sweep=sweep, agent="host:1")
    superuser = UserFactory(username="root", is_superuser=True, is_staff=True)
    UserFactory(username="newbie")
    users = {
        "outsider": outsider,
        "viewer": viewer,
        "member": member,
        "creator": creator,
        "admin": admin,
        "superuser": superuser,
    }
    client = APIClient()
    client.force_authenticate(creator)
    assert (
        client.put(
            f"/api/v1/runs/{run.pk}/artifacts/notes.txt", ARTIFACT, content_type="application/octet-stream"
        ).status_code
        == 201
    )
    tokens = {
        "own_token": run_token_issue(job=job).key,
        "other_token": run_token_issue(job=other_job).key,
        "read_token": api_key(admin, scope="read"),
        "write_token": api_key(creator, scope="write"),
    }
    laptop, _key = api_token_create(user=creator, name="laptop")
    bot = service_account_create(actor=admin, project=project, name="ci-bot")
    bot_token, tokens["service_account"] = service_account_token_create(actor=admin, account=bot, name="pipeline")
    elsewhere = service_account_create(actor=outsider, project=other_project, name="intruder", role="admin")
    tokens["outside_service_account"] = service_account_token_create(
        actor=outsider, account=elsewhere, name="pipeline", scope="admin"
    )[1]
    logged_model = logged_model_create(actor=creator, project=project, name="net", source_run=run)
    channel, _ = channel_create(actor=admin, project=project, name="oncall", kind="email", target="ops@example.org")
    rule = rule_create(actor=admin, project=project, name="crashes", event="crashed", personal=False)
    registered = registry.registered_model_create(actor=creator, name="net-model", tags=[PLACE(project)])
    registry.model_version_create(
        actor=creator, model=registered, source=f"models:/{logged_model.model_id}", run=run, logged_model=logged_model
    )
    registry.model_alias_set(
        actor=admin, model=registered, alias="champion", version=registered.versions.get(version=1)
    )
    return {
        "alert_channel": channel,
        "alert_rule": rule,
        "registered_model": registered,
        "logged_model": logged_model,
        "laptop_token": laptop,
        "bot_token": bot_token,
        "project": project,
        "run": run,
        "job": job,
        "checkpoint": ckpt,
        "sweep": sweep,
        "dataset": dataset,
        "version": version,
        "code": code_version.code,
        "code_version": code_version,
        "queue": queue,
        "users": users,
        "tokens": tokens,
        "member": member,
    }


def PLACE(project) -> dict:  # noqa: N802 - the tag that places a new registered model in ``project``
    return {"key": registry.PROJECT_TAG, "value": project.slug}


def client_for(role: str, world, *, page: bool):
    """A client as ``role``: pages log in with the session, the APIs send the user's token (or the Run token)."""
    client = APIClient()
    if role in world["tokens"]:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {world['tokens'][role]}")
    elif role != "anonymous":
        user = world["users"][role]
        if page:
            client.force_login(user)
        else:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key(user)}")
    return client


def concrete(route: str, world) -> str:
    """The route with its parameters filled in from the world (the Run's id for ``pk`` under runs/, …)."""
    run, project = world["run"], world["project"]
    head = re.sub(r"^(api/v1/|mlflow/)?\^?", "", route).split("/")[0]
    pk = {
        "runs": run.pk,
        "jobs": world["job"].pk,
        "checkpoints": world["checkpoint"].pk,
        "sweeps": world["sweep"].pk,
        "alert-channels": world["alert_channel"].pk,
        "alert-rules": world["alert_rule"].pk,
        "models": world["registered_model"].pk,
    }.get(head, "")
    values = {
        "slug": project.slug,
        "username": world["member"].username,
        "dataset_id": world["dataset"].pk,
        "code_id": world["code"].pk,
        "run_id": run.pk,
        "checkpoint_id": world["checkpoint"].pk,
        "pk": pk,
        "path": "notes.txt",
        "number": 1,
        "action": "create",
        "rest": "2.0/mlflow/unknown",
        "artifact_path": f"{project.pk}/{run.external_id}/artifacts/notes.txt",
        "model_id": world["logged_model"].model_id,
        "tag_key": "absent",
        "rule_id": world["alert_rule"].pk,
        "channel_id": world["alert_channel"].pk,
        "token_id": world["bot_token" if "service-accounts" in route else "laptop_token"].pk,
        "name": "ci-bot",
        "alias": "champion",
        "version": 1,
    }
    url = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: str(values[m.group(1)]), route)
    url = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(values[m.group(1)]), url)
    return "/" + url.replace("^", "").replace("$", "").replace("\\Z", "").replace("\\.", ".")


def request_body(route: str, method: str, world):
    """``(data, format-or-content-type)`` a writer would send; ``None`` data for reads."""
    run, project = world["run"], world["project"]
    mlflow_run = {"run_id": run.external_id}
    model, version = {"name": "net-model"}, {"name": "net-model", "version": "1"}
    bodies = {
        "registered-models/create": {"name": "fresh-model"},
        "registered-models/update": {**model, "description": "digits"},
        "registered-models/rename": {**model, "new_name": "renamed-model"},
        "registered-models/search": {"filter": "name = 'net-model'"},
        "registered-models/set-tag": {**model, "key": "team", "value": "vision"},
        "registered-models/delete-tag": {**model, "key": "absent"},
        "registered-models/alias": {**version, "alias": "champion"},
        "registered-models/get": model,
        "registered-models/delete": model,
        "get-latest-versions": model,
        "model-versions/get": version,
        "model-versions/delete": version,
        "get-download-uri": version,
        "model-versions/create": {**model, "source": "runs:/x/net", "run_id": run.external_id},
        "model-versions/search": {"filter": "name = 'net-model'"},
        "model-versions/update": {**version, "description": "baseline"},
        "model-versions/set-tag": {**version, "key": "reviewed", "value": "yes"},
        "model-versions/delete-tag": {**version, "key": "absent"},
        "model-versions/transition-stage": {**version, "stage": "Production"},
        "^projects/$": {"name": "New", "slug": "new-project"},
        "members/": {"username": "newbie", "role": "viewer"},
        "members/<str:username>/": {"role": "viewer"},
        "datasets/": {"name": "more"},
        "versions/": {"version": "v9", "uri": "s3://x"},
        "codes/": {"name": "other-code"},
        "^runs/$": {"project": project.slug, "name": "fresh"},
        "^runs/(?P<pk>[0-9]+)/$": {"status": "aborted"},
        "metrics/": {"points": [{"key": "loss", "value": 0.5, "step": 1}]},
        "checkpoints/": {"step": 20, "framework": "torch-dcp", "world_size": 2},
        "data-stages/": {"start_step": 5, "input_dataset_version_ids": [world["version"].pk]},
        "restore-report/": {"checkpoint_id": world["checkpoint"].pk, "parts": {"model": "restored"}},
        "<slug:slug>/parity/": {"tolerance": 1e-5},
        "retention-policy/": {"keep_last": 3},
        "retention-policy/preview/": {"keep_last": 3},
        "bulk-delete/": {"run_ids": [run.pk]},
        "upload-parts/": {"tar_size": 1},
        "complete/": {"tar_size": 10, "tar_sha256": "0" * 64, "manifest": []},
        "resume/": {"queue": "cpu", "nproc_per_node": 2},
        "continue/": {
            "queue": "cpu",
            "name": "continued",
            "code_version_id": world["code_version"].pk,
            "input_dataset_version_ids": [world["version"].pk],
            "nproc_per_node": 2,
        },
        "^jobs/$": {
            "project": project.slug,
            "code_version_id": world["code_version"].pk,
            "queue": "cpu",
            "parameters": {},
            "dataset_version_ids": [],
            "nproc_per_node": 2,
        },
        "^sweeps/$": {
            "project": project.slug,
            "config": {
                "method": "grid",
                "metric": {"name": "loss", "goal": "minimize"},
                "parameters": {"lr": {"values": [0.1]}},
                "program": "python train.py",
            },
        },
        "claim/": {"agent": "host:1"},
        "report/$": {"exit_code": 0},
        "experiments/get-by-name": {"experiment_name": project.name},
        "experiments/get": {"experiment_id": str(project.pk)},
        "experiments/create": {"name": project.name},
        "experiments/search": {"max_results": 10},
        "runs/create": {"experiment_id": str(project.pk)},
        "runs/get": mlflow_run,
        "runs/update": {**mlflow_run, "status": "RUNNING"},
        "runs/search": {"experiment_ids": [str(project.pk)]},
        "runs/log-batch": {**mlflow_run, "metrics": [{"key": "acc", "value": 1, "timestamp": 1, "step": 1}]},
        "runs/log-metric": {**mlflow_run, "key": "acc", "value": 1, "timestamp": 1, "step": 2},
        "runs/log-parameter": {**mlflow_run, "key": "seed", "value": "1"},
        "runs/set-tag": {**mlflow_run, "key": "note", "value": "x"},
        "runs/delete-tag": {**mlflow_run, "key": "absent"},
        "runs/delete": mlflow_run,
        "runs/restore": mlflow_run,
        "runs/log-inputs": {**mlflow_run, "datasets": []},
        "experiments/set-experiment-tag": {"experiment_id": str(project.pk), "key": "team", "value": "vision"},
        "experiments/delete-experiment-tag": {"experiment_id": str(project.pk), "key": "absent"},
        "metrics/get-history": {**mlflow_run, "metric_key": "acc"},
        "mlflow-artifacts/artifacts": {"path": f"{project.pk}/{run.external_id}/artifacts"},
        "runs/outputs": {**mlflow_run, "models": [{"model_id": world["logged_model"].model_id, "step": 3}]},
        "runs/log-model": {**mlflow_run, "model_json": json.dumps({"artifact_path": "net", "flavors": {}})},
        "logged-models": {"experiment_id": str(project.pk), "name": "fresh", "source_run_id": run.external_id},
        "logged-models/search": {"experiment_ids": [str(project.pk)]},
        "logged-models/<str:model_id>": {"status": "LOGGED_MODEL_READY"},
        "<str:model_id>/tags": {"tags": [{"key": "stage", "value": "prod"}]},
        "<str:model_id>/params": {"params": [{"key": "lr", "value": "0.1"}]},
        "[\\s\\S]+)": {"num_parts": 2},
        "alert-rules/": {"name": "failures", "event": "failed"},
        "alert-channels/": {"name": "team", "kind": "email", "target": "team@example.org"},
        "<int:run_id>/alerts/": {"title": "loss plateaued"},
        "v1/tokens/": {"name": "ci", "scope": "read"},
        "service-accounts/": {"name": "new-bot", "role": "viewer"},
        "<slug:name>/tokens/": {"name": "ci", "scope": "read"},
    }
    if route.endswith("codes/<int:code_id>/versions/") and method == "POST":
        return {"entrypoint": json.dumps(["python", "train.py"])}, "multipart"
    if method == "PUT" and route.endswith("retention-policy/"):
        return {"keep_last": 3}, "json"
    if method in ("PUT",):
        return ARTIFACT, "application/octet-stream"
    bare = route.replace("\\Z", "")
    for tail, body in bodies.items():
        if bare.endswith(tail) and (method != "GET" or route.startswith(("api/2.0", "mlflow/"))):
            return body, "json"
    return ({} if method != "GET" else None), "json"


def page_form(route: str, world) -> dict:
    """What a writer submits on the page of ``route`` (POST)."""
    forms = {
        "members/": {"username": "newbie", "role": "viewer"},
        "role/": {"role": "viewer"},
        "data-history/": {"start_step": 5, "input_dataset_version_ids": [world["version"].pk]},
        "sweeps/new/": {
            "config": "method: grid\nmetric: {name: loss, goal: minimize}\n"
            "parameters: {lr: {values: [0.1]}}\nprogram: python train.py\n"
        },
        "jobs/new/": {
            "name": "j",
            "queue": "cpu",
            "parameters": "{}",
            "code_version": world["code_version"].pk,
            "kind": "training",
            "max_retries": 0,
            "nproc_per_node": 2,
        },
        "continue/": {
            "confirm": "1",
            "queue": "cpu",
            "name": "continued",
            "parameters": "{}",
            "code_version": world["code_version"].pk,
            "nproc_per_node": 2,
        },
        "resume/": {"confirm": "1", "queue": "cpu", "nproc_per_node": 2},
        "storage/policy/": {"keep_last": 3},
        "checkpoints/bulk-delete/": {"run": world["run"].pk},
        "delete/": {"confirm": "1", "path": "notes.txt"},
        "register/": {"name": "fresh-model"},
        "aliases/": {"alias": "champion", "version": "1"},
        "alerts/rules/": {"name": "failures", "event": "failed"},
        "alerts/channels/": {"name": "team", "kind": "email", "target": "team@example.org"},
        "accounts/tokens/": {"name": "ci", "scope": "read", "expires_in_days": 30},
        "service-accounts/": {"name": "web-bot", "role": "viewer"},
        "<slug:name>/tokens/": {"token_name": "ci", "scope": "read"},
    }
    return next((body for tail, body in forms.items() if route.endswith(tail)), {})


PAGE_QUERIES = {"runs/<int:pk>/artifacts/delete/": {"path": "notes.txt"}}


def send(client, method: str, url: str, route: str, world, *, page: bool):
    if page:
        data = page_form(route, world) if method == "POST" else PAGE_QUERIES.get(route, {})
        return getattr(client, method.lower())(url, data)
    data, kind = request_body(route, method, world)
    call = getattr(client, method.lower())
    if method == "GET":
        return call(url, data or {})
    if kind == "multipart":
        return call(url, data, format="multipart")
    if kind == "json":
        return call(url, data, format="json")
    return call(url, data, content_type=kind)


def is_page(route: str) -> bool:
    return not route.startswith(("api/", "mlflow/"))


def leaked_names(body: bytes, asked: str, world) -> list[str]:
    """The Project's and Run's names in ``body``, except one the request itself carries in ``asked`` (its URL and
    body): a 404 page repeats the path asked for, and "no project 'vision' among your projects" the slug sent,
    whether or not anything is there."""
    project, run = world["project"], world["run"]
    names = [project.slug, project.name, run.external_id, run.name]
    return [name for name in names if name.encode() in body and name.lower() not in asked.lower()]


def sent_data(method: str, route: str, world, *, page: bool):
    """What ``send`` puts in the request besides its URL, as text."""
    if page:
        data = page_form(route, world) if method == "POST" else PAGE_QUERIES.get(route, {})
    else:
        data = request_body(route, method, world)[0]
    return data if isinstance(data, bytes | str) else json.dumps(data, default=str)


@pytest.mark.parametrize("route", sorted(ROWS))
def test_each_role_gets_the_declared_answer(route, world):
    """Every method × role of ``route`` answers as the table says; an outsider's answer names nothing of ours."""
    url, page = concrete(route, world), is_page(route)
    got, leaks = {}, []
    for method, _expected in ROWS[route].items():
        for role in ROLES:
            with transaction.atomic():
                response = send(client_for(role, world, page=page), method, url, route, world, page=page)
                transaction.set_rollback(True)
            got[(method, role)] = response.status_code
            if role == "outsider":
                body = b"".join(response.streaming_content) if response.streaming else response.content
                asked = f"{url} {sent_data(method, route, world, page=page)}"
                leaks += [(method, name) for name in leaked_names(body, asked, world)]
    wanted = {(method, role): status for method, row in ROWS[route].items() for role, status in row.items()}
    wrong = {
        f"{method} {role}": f"{got[method, role]} (table: {wanted[method, role]})"
        for method, role in got
        if got[method, role] != wanted[method, role]
    }
    assert wrong == {}
    assert leaks == [], "an outsider's answer names the Project or Run"
