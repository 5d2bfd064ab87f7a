"""Every endpoint that writes is in the audit table (docs/api.md#audit): calling it records exactly the declared
audit records with the right actor, or it is declared as not audited with the reason.

The writing endpoints come from the endpoint × role matrix (``tests.policy_table``), which itself comes from
the URL conf, so a new writing endpoint without a line here fails ``test_every_write_is_declared``. Each
audited endpoint is called once by the first role the matrix lets write (creator, admin, member, the Run's
own token), in the matrix's world, and the records it left are compared.
"""

import pytest
from django.db import transaction

from mado.models import AuditEvent
from tests.policy_table import API, ART, ML, READ_POSTS, ROWS
from tests.test_policy_table import client_for, concrete, is_page, send, world  # noqa: F401 - the world fixture

WRITES = {"POST", "PUT", "PATCH", "DELETE"}
WRITERS = ("creator", "admin", "member", "own_token")

# Reasons an endpoint that writes leaves no record.
RUN_DATA = "logs a Run's own data (metrics, params, tags, files, checkpoints, inputs): the Run keeps that history"
CREATES = "creates something new in a Project (a Run, Sweep, Code, Dataset, tag); nothing existing changes"
SESSION = "changes the browser session only (sign-in, language, table columns)"
REFUSED = "refused in the matrix's world (409/400/501): its record is asserted in tests/mado/test_audit.py"
NO_CHANGE = "the matrix's request changes nothing there (same status, not deleted): a no-op records nothing"
READS = "only reads, though sent by POST (a search)"
SENDS = "sends an alert or a test message: the channel's delivery log records it"
ABSENT = "names what does not exist in the matrix's world (404): its record is asserted in test_registry_audit.py"
UNSUPPORTED = "always refused (400): mado has aliases, not MLflow's deprecated stages; nothing changes"

AUDITED = {
    # /api/v1/
    API + "^projects/$": {"POST": "project.create"},
    API + "projects/<slug:slug>/members/": {"POST": "membership.add"},
    API + "projects/<slug:slug>/members/<str:username>/": {
        "PATCH": "membership.change_role",
        "DELETE": "membership.remove",
    },
    API + "^runs/(?P<pk>[0-9]+)/$": {"PATCH": "run.end"},
    API + "runs/<int:run_id>/artifacts/<path:path>": {"PUT": RUN_DATA, "DELETE": "artifact.delete"},
    API + "projects/<slug:slug>/parity/": {"PATCH": "project.set_parity_tolerance"},
    API + "checkpoints/<int:checkpoint_id>/": {"DELETE": REFUSED},
    API + "checkpoints/<int:checkpoint_id>/resume/": {"POST": REFUSED},
    API + "checkpoints/<int:checkpoint_id>/continue/": {"POST": "run.continue"},
    API + "^jobs/$": {"POST": "job.launch"},
    API + "^jobs/(?P<pk>[0-9]+)/abort/$": {"POST": "job.abort"},
    API + "^jobs/(?P<pk>[0-9]+)/resume-latest/$": {"POST": REFUSED},
    API + "^sweeps/(?P<pk>[0-9]+)/trials/(?P<number>[0-9]+)/report/$": {"POST": "run.end"},
    API + "^sweeps/(?P<pk>[0-9]+)/trials/(?P<number>[0-9]+)/retry/$": {"POST": REFUSED},
    API + "tokens/": {"POST": "token.create"},
    API + "tokens/<int:token_id>/": {"DELETE": "token.revoke"},
    API + "projects/<slug:slug>/service-accounts/": {"POST": "service_account.create"},
    API + "projects/<slug:slug>/service-accounts/<slug:name>/tokens/": {"POST": "token.create"},
    API + "projects/<slug:slug>/service-accounts/<slug:name>/tokens/<int:token_id>/": {"DELETE": "token.revoke"},
    API + "projects/<slug:slug>/alert-rules/": {"POST": "alert_rule.create"},
    API + "alert-rules/<int:rule_id>/": {"DELETE": "alert_rule.delete"},
    API + "projects/<slug:slug>/alert-channels/": {"POST": "alert_channel.create"},
    API + "alert-channels/<int:channel_id>/": {"DELETE": "alert_channel.delete"},
    API + "alert-channels/<int:channel_id>/test/": {"POST": SENDS},
    API + "runs/<int:run_id>/alerts/": {"POST": SENDS},
    API + "projects/<slug:slug>/retention-policy/": {"PUT": "retention_policy.set"},
    API + "projects/<slug:slug>/retention-policy/preview/": {"POST": READS},
    API + "projects/<slug:slug>/retention-policy/apply/": {"POST": REFUSED},
    API + "projects/<slug:slug>/checkpoints/bulk-delete/": {"POST": "checkpoint.bulk_delete"},
    # MLflow
    ML + "runs/update": {"POST": NO_CHANGE},
    ML + "runs/delete": {"POST": "run.delete"},
    ML + "runs/restore": {"POST": NO_CHANGE},
    ML + "experiments/create": {"POST": REFUSED},
    ML + "experiments/delete": {"POST": REFUSED},
    ML + "experiments/restore": {"POST": REFUSED},
    ML + "registered-models/update": {"PATCH": "registered_model.update"},
    ML + "registered-models/rename": {"POST": "registered_model.rename"},
    ML + "registered-models/delete": {"DELETE": "registered_model.delete"},
    ML + "registered-models/set-tag": {"POST": "registered_model.set_tag"},
    ML + "registered-models/delete-tag": {"DELETE": ABSENT},
    ML + "registered-models/get-latest-versions": {"POST": READS},
    # The world's alias already points at the version the request names.
    ML + "registered-models/alias": {"POST": NO_CHANGE, "DELETE": "model_alias.delete"},
    ML + "model-versions/update": {"PATCH": "model_version.update"},
    ML + "model-versions/delete": {"DELETE": "model_version.delete"},
    ML + "model-versions/set-tag": {"POST": "model_version.set_tag"},
    ML + "model-versions/delete-tag": {"DELETE": ABSENT},
    ML + "model-versions/transition-stage": {"POST": UNSUPPORTED},
    ART + "^artifacts/(?P<artifact_path>[\\s\\S]+)\\Z": {"PUT": RUN_DATA, "DELETE": "artifact.delete"},
    ART + "^mpu/(?P<action>[a-z]+)/(?P<artifact_path>[\\s\\S]+)\\Z": {"POST": REFUSED},
    # pages
    "projects/<slug:slug>/members/": {"POST": "membership.add"},
    "projects/<slug:slug>/members/<str:username>/role/": {"POST": "membership.change_role"},
    "projects/<slug:slug>/members/<str:username>/remove/": {"POST": "membership.remove"},
    "runs/<int:pk>/artifacts/delete/": {"POST": "artifact.delete"},
    "checkpoints/<int:pk>/delete/": {"POST": REFUSED},
    "checkpoints/<int:pk>/resume/": {"POST": REFUSED},
    "checkpoints/<int:pk>/continue/": {"POST": "run.continue"},
    "projects/<slug:slug>/jobs/new/": {"POST": "job.launch"},
    "jobs/<int:pk>/abort/": {"POST": "job.abort"},
    "jobs/<int:pk>/resume-latest/": {"POST": REFUSED},
    "accounts/tokens/": {"POST": "token.create"},
    "projects/<slug:slug>/service-accounts/": {"POST": "service_account.create"},
    "projects/<slug:slug>/service-accounts/<slug:name>/tokens/": {"POST": "token.create"},
    "projects/<slug:slug>/service-accounts/<slug:name>/tokens/<int:token_id>/revoke/": {"POST": "token.revoke"},
    "accounts/tokens/<int:token_id>/revoke/": {"POST": "token.revoke"},
    "accounts/logout/": {"POST": SESSION},
    "alert-channels/<int:pk>/send-test/": {"POST": SENDS},
    "alert-channels/<int:pk>/delete/": {"POST": "alert_channel.delete"},
    "projects/<slug:slug>/alerts/rules/": {"POST": "alert_rule.create"},
    "models/<int:pk>/aliases/": {"POST": NO_CHANGE},  # the world's alias already points at version 1
    "models/<int:pk>/aliases/<str:alias>/delete/": {"POST": "model_alias.delete"},
    "models/<int:pk>/versions/<int:version>/delete/": {"POST": "model_version.delete"},
    "alert-rules/<int:pk>/delete/": {"POST": "alert_rule.delete"},
    "projects/<slug:slug>/alerts/channels/": {"POST": "alert_channel.create"},
    "projects/<slug:slug>/storage/policy/": {"POST": "retention_policy.set"},
    "projects/<slug:slug>/storage/apply/": {"POST": REFUSED},
    "projects/<slug:slug>/checkpoints/bulk-delete/": {"POST": "checkpoint.bulk_delete"},
    "i18n/setlang/": {"POST": SESSION},
    "projects/<slug:slug>/columns/": {"POST": SESSION},
}
AUDITED |= {"mlflow/" + route: row for route, row in AUDITED.items() if route.startswith(("api/2.0/", "api/^"))}

RUN_DATA_TAILS = (
    "metrics/",
    "heartbeat/",
    "checkpoints/",
    "data-stages/",
    "restore-report/",
    "/tar",
    "upload-parts/",
    "complete/",
    "log-batch",
    "log-metric",
    "log-parameter",
    "set-tag",
    "delete-tag",
    "log-inputs",
    "runs/outputs",
    "log-model",
    "logged-models",
    "logged-models/<str:model_id>",
    "/tags",
    "/tags/<path:tag_key>",
    "/params",
    "data-history/",
)
CREATE_TAILS = (
    "^runs/$",
    "datasets/",
    "versions/",
    "codes/",
    "^sweeps/$",
    "claim/$",
    "runs/create",
    "registered-models/create",
    "model-versions/create",
    "/register/",
    "experiment-tag",
    "sweeps/new/",
    "2\\.0/mlflow/.*|3\\.0/mlflow/.*)$",
)


def declared(route: str, method: str) -> str:
    """The action ``route`` × ``method`` records, or the reason it records none."""
    if method in AUDITED.get(route, {}):
        return AUDITED[route][method]
    if route.removeprefix("mlflow/") in READ_POSTS:
        return READS
    if route.endswith(RUN_DATA_TAILS):
        return RUN_DATA
    if route.endswith(CREATE_TAILS):
        return CREATES
    return ""


WRITE_CELLS = sorted((route, method) for route, row in ROWS.items() for method in row if method in WRITES)
REASONS = {RUN_DATA, CREATES, SESSION, REFUSED, NO_CHANGE, READS, SENDS, ABSENT, UNSUPPORTED}


def test_every_write_is_declared():
    assert [cell for cell in WRITE_CELLS if not declared(*cell)] == []


AUDITED_CELLS = [cell for cell in WRITE_CELLS if declared(*cell) and declared(*cell) not in REASONS]


@pytest.mark.parametrize("route, method", AUDITED_CELLS)
def test_each_audited_write_records_one_event_with_its_actor(route, method, world):
    action = declared(route, method)
    role = next(r for r in WRITERS if ROWS[route][method][r] < 400)
    page = is_page(route)
    client = client_for(role, world, page=page)  # before counting: it may create the role's API token
    before = set(AuditEvent.objects.values_list("pk", flat=True))
    with transaction.atomic():
        response = send(client, method, concrete(route, world), route, world, page=page)
        assert response.status_code == ROWS[route][method][role], response.content[:300]
        events = list(AuditEvent.objects.exclude(pk__in=before))
        transaction.set_rollback(True)
    user = world["users"]["creator" if role == "own_token" else role]
    assert [(e.action, e.actor_name, e.actor_kind) for e in events] == [
        (action, user.username, "run_token" if role == "own_token" else "user")
    ]
    assert events[0].request_id, "the request's id is recorded"
    if action not in ("project.create", "token.create", "token.revoke"):
        assert events[0].project_id == world["project"].pk
