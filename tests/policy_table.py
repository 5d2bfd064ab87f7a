"""Who gets what, endpoint by endpoint: the answer every role gets on every URL pattern and method
(docs/design/runs.md#write-rule).

``mado.policy`` is the rule; this table is its consequence on the wire, one
row per URL pattern of ``config.urls`` (the route as Django prints it), one
entry per HTTP method, one HTTP status per role. ``tests/test_policy_table.py``
sends each request as each role against one small world (a running Job's
Run created by ``creator``, with a checkpoint, an artifact and the Job's Run
token) and compares; a URL pattern without a row fails that test, so a new
endpoint is added here with its answers. docs/api.md shows the same rule as
a short table.

Roles, in this order: ``anonymous``; ``outsider`` (member of another Project
only); ``viewer``; ``member`` (not the Run's creator); ``creator`` (created
the Run and its Job); ``admin`` (Project admin); ``superuser`` (Django
superuser, no membership: sees nothing through the product, only /admin/);
``own_token`` (the Run token of the Run the URL names); ``other_token`` (the
Run token of another Run of the same Project). A Run token authenticates as
the Job's creator but only for its own Run; pages take no token (they use the
session), so a token alone is sent to the login page like ``anonymous``.

Token scope is a dimension too (docs/api.md#tokens): ``read_token`` is the
Project admin's API token of scope ``read``, ``write_token`` the creator's of
scope ``write``. So are service accounts (docs/api.md#service-accounts):
``service_account`` is the Project's own (role member) with its write token,
``outside_service_account`` another Project's (role admin there) with its
admin token. Unless a row says otherwise (``read_token=`` …), ``scope_cells``
derives them: on pages all are ``anonymous``; on the APIs ``write_token``
answers as ``creator``, ``read_token`` as ``admin`` for a read (GET, or a
POST in ``READ_POSTS``) and 403 for every write, ``service_account`` as
``member`` and ``outside_service_account`` as ``outsider``.
"""

ROLES = (
    "anonymous",
    "outsider",
    "viewer",
    "member",
    "creator",
    "admin",
    "superuser",
    "own_token",
    "other_token",
    "read_token",
    "write_token",
    "service_account",
    "outside_service_account",
)
DERIVED = None  # a token-scope cell ``with_token_scopes`` fills in


def answers(
    anonymous,
    outsider,
    viewer,
    member,
    creator,
    admin,
    superuser,
    own_token,
    other_token,
    *,
    read_token=DERIVED,
    write_token=DERIVED,
    service_account=DERIVED,
    outside_service_account=DERIVED,
) -> dict:
    """``{role: HTTP status}`` in ``ROLES`` order."""
    cells = (anonymous, outsider, viewer, member, creator, admin, superuser, own_token, other_token)
    return dict(zip(ROLES, (*cells, read_token, write_token, service_account, outside_service_account)))


def api_read(ok: int = 200, *, tokens: int | None = None) -> dict:
    """Any member or viewer reads (``ok``); a Run token only on its own Run (``tokens``: both tokens' answer when
    the URL names no Run)."""
    own, other = (ok, 403) if tokens is None else (tokens, tokens)
    return answers(401, 404, ok, ok, ok, ok, 404, own, other)


def api_list(*, tokens: int = 403) -> dict:
    """A list: everyone signed in gets 200 with what they may see (an outsider and a superuser: none of ours)."""
    return answers(401, 200, 200, 200, 200, 200, 200, tokens, tokens)


def run_write(ok: int) -> dict:
    """Writing to the Run: its creator, a Project admin and the Run's own token (``ok``); other members 403."""
    return answers(401, 404, 403, 403, ok, ok, 404, ok, 403)


def member_write(ok: int, *, tokens: int = 403) -> dict:
    """Creating in the Project (Runs, Jobs, Codes, Datasets, Sweeps) or continuing from a checkpoint: any member."""
    return answers(401, 404, 403, ok, ok, ok, 404, tokens, tokens)


def admin_only(ok: int, *, member: int = 403) -> dict:
    """Project admins only (members, deleting artifacts)."""
    return answers(401, 404, 403, member, member, ok, 404, 403, 403)


def page_read(ok: int = 200) -> dict:
    """A page any member or viewer sees; a token alone is no session (login page)."""
    return answers(302, 404, ok, ok, ok, ok, 404, 302, 302)


def page(viewer: int, member: int, creator: int, admin: int) -> dict:
    """A page whose answer differs by role (form shown, refused with the reason, or done and redirected)."""
    return answers(302, 404, viewer, member, creator, admin, 404, 302, 302)


def mlflow_read(ok: int = 200, *, tokens: int | None = None) -> dict:
    """An MLflow read; 401 for anonymous, RESOURCE_DOES_NOT_EXIST (404) outside the Project."""
    return api_read(ok, tokens=tokens)


API = "api/v1/"
ML = "api/2.0/mlflow/"
ART = "api/2.0/mlflow-artifacts/"

ROWS = {
    # --- /api/v1/ -----------------------------------------------------------------------------------
    API: {"GET": api_list()},
    API + "schema/": {"GET": answers(*(200,) * 9)},
    API + "docs/": {"GET": answers(*(200,) * 9)},
    # A service account acts only in its own Project: it creates none (docs/api.md#service-accounts).
    API + "^projects/$": {
        "GET": api_list(),
        "POST": answers(401, 201, 201, 201, 201, 201, 201, 403, 403, service_account=403, outside_service_account=403),
    },
    API + "^projects/(?P<slug>[^/.]+)/$": {"GET": api_read(tokens=403)},
    API + "projects/<slug:slug>/members/": {"GET": api_read(tokens=403), "POST": admin_only(201)},
    API + "projects/<slug:slug>/members/<str:username>/": {"PATCH": admin_only(200), "DELETE": admin_only(204)},
    API + "projects/<slug:slug>/datasets/": {"GET": api_read(tokens=403), "POST": member_write(201)},
    API + "datasets/<int:dataset_id>/versions/": {"GET": api_read(tokens=403), "POST": member_write(201)},
    API + "projects/<slug:slug>/codes/": {"GET": api_read(tokens=403), "POST": member_write(201)},
    API + "codes/<int:code_id>/versions/": {"GET": api_read(tokens=403), "POST": member_write(201)},
    API + "^runs/$": {"GET": api_list(), "POST": member_write(201)},
    API + "^runs/(?P<pk>[0-9]+)/$": {"GET": api_read(), "PATCH": run_write(200)},
    API + "runs/<int:run_id>/metrics/": {"GET": api_read(), "POST": run_write(201)},
    API + "runs/<int:run_id>/heartbeat/": {"POST": run_write(200)},
    API + "runs/<int:run_id>/artifacts/": {"GET": api_read()},
    API + "runs/<int:run_id>/artifacts/<path:path>": {
        "GET": api_read(),
        "PUT": run_write(200),
        "DELETE": admin_only(204),
    },
    API + "runs/<int:run_id>/checkpoints/": {"GET": api_read(), "POST": run_write(201)},
    API + "runs/<int:run_id>/data-stages/": {"GET": api_read(), "POST": run_write(201)},
    API + "runs/<int:run_id>/restore-report/": {"POST": run_write(201)},
    API + "projects/<slug:slug>/parity/": {"GET": api_read(tokens=403), "PATCH": admin_only(200)},
    API + "projects/<slug:slug>/usage/": {"GET": api_read(tokens=403)},
    API + "runs/<int:run_id>/usage/": {"GET": api_read()},
    API + "projects/<slug:slug>/retention-policy/": {"GET": api_read(404, tokens=403), "PUT": admin_only(200)},
    API + "projects/<slug:slug>/retention-policy/preview/": {"POST": admin_only(200)},
    API + "projects/<slug:slug>/retention-policy/apply/": {"POST": admin_only(400)},
    API + "projects/<slug:slug>/checkpoints/bulk-delete/": {"POST": admin_only(200)},
    API + "checkpoints/<int:checkpoint_id>/": {"GET": api_read(), "DELETE": admin_only(409)},
    API + "checkpoints/<int:checkpoint_id>/tar": {"GET": api_read(409), "PUT": run_write(409)},
    API + "checkpoints/<int:checkpoint_id>/files/<path:path>": {"GET": api_read(409)},
    API + "checkpoints/<int:checkpoint_id>/upload-parts/": {"POST": run_write(409)},
    API + "checkpoints/<int:checkpoint_id>/complete/": {"POST": run_write(409)},
    API + "checkpoints/<int:checkpoint_id>/resume/": {"POST": run_write(409) | {"own_token": 403}},
    API + "checkpoints/<int:checkpoint_id>/continue/": {"POST": member_write(201)},
    API + "queues/": {"GET": answers(401, 200, 200, 200, 200, 200, 200, 403, 403)},
    # Alerts: members read the Project's rules and channels and own their subscriptions, admins manage the
    # Project's rules and channels (the body is a Project rule); viewers nothing.
    # An admin's read token acts as a viewer: the alert pages' reads for members and admins refuse it.
    API + "projects/<slug:slug>/alert-rules/": {
        "GET": member_write(200) | {"read_token": 403},
        "POST": admin_only(201),
    },
    API + "alert-rules/<int:rule_id>/": {"DELETE": admin_only(204)},
    API + "projects/<slug:slug>/alert-channels/": {
        "GET": member_write(200) | {"read_token": 403},
        "POST": admin_only(201),
    },
    API + "alert-channels/<int:channel_id>/": {"DELETE": admin_only(204)},
    API + "alert-channels/<int:channel_id>/test/": {"POST": admin_only(202)},
    API + "alert-channels/<int:channel_id>/deliveries/": {"GET": admin_only(200) | {"read_token": 403}},
    API + "runs/<int:run_id>/alerts/": {"POST": run_write(201)},
    API + "projects/<slug:slug>/reliability/": {"GET": api_read(tokens=403)},
    API + "^jobs/$": {"GET": api_list(), "POST": member_write(201)},
    API + "^jobs/(?P<pk>[0-9]+)/$": {"GET": api_read(tokens=403)},
    API + "^jobs/(?P<pk>[0-9]+)/logs/$": {"GET": api_read(tokens=403)},
    API + "^jobs/(?P<pk>[0-9]+)/abort/$": {"POST": run_write(200) | {"own_token": 403}},
    API + "^jobs/(?P<pk>[0-9]+)/resume-latest/$": {"POST": run_write(409) | {"own_token": 403}},
    API + "^sweeps/$": {"GET": api_list(), "POST": member_write(201)},
    API + "^sweeps/(?P<pk>[0-9]+)/$": {"GET": api_read(tokens=403)},
    API + "^sweeps/(?P<pk>[0-9]+)/claim/$": {"POST": member_write(200)},
    # The trial is claimed by the creator's agent: only its holder (and admins) end its Run.
    API + "^sweeps/(?P<pk>[0-9]+)/trials/(?P<number>[0-9]+)/report/$": {"POST": run_write(200) | {"own_token": 403}},
    # Retrying: whoever may run the sweep's agent; the world's trial 1 is claimed, not failed, so a member gets 409.
    API + "^sweeps/(?P<pk>[0-9]+)/trials/(?P<number>[0-9]+)/retry/$": {"POST": member_write(409)},
    # --- MLflow tracking API (also under the mlflow/ prefix, see below) ------------------------------
    # A Run token reads the experiment (Project) of its own Run; other_token is of a Run of this same Project.
    ML + "experiments/get-by-name": {"GET": mlflow_read(tokens=200)},
    ML + "experiments/get": {"GET": mlflow_read(tokens=200)},
    # The body names an experiment the Project's members see (400: it exists); another Project's service account
    # may create none (403).
    ML + "experiments/create": {
        "POST": answers(401, 400, 400, 400, 400, 400, 400, 403, 403, outside_service_account=403)
    },
    ML + "experiments/search": {"GET": api_list(), "POST": api_list()},
    ML + "experiments/delete": {"POST": answers(401, 400, 400, 400, 400, 400, 400, 403, 403)},
    ML + "experiments/restore": {"POST": answers(401, 400, 400, 400, 400, 400, 400, 403, 403)},
    # Experiment tags: any member of the Project (the tag of the test's body is absent, so deleting it is a 404).
    ML + "experiments/set-experiment-tag": {"POST": member_write(200)},
    ML + "experiments/delete-experiment-tag": {"POST": member_write(404)},
    ML + "runs/create": {"POST": member_write(200)},
    ML + "runs/get": {"GET": mlflow_read()},
    ML + "runs/update": {"POST": run_write(200)},
    ML + "runs/search": {"GET": api_list(), "POST": api_list()},
    ML + "runs/log-batch": {"POST": run_write(200)},
    ML + "runs/log-metric": {"POST": run_write(200)},
    ML + "runs/log-parameter": {"POST": run_write(200)},
    ML + "runs/set-tag": {"POST": run_write(200)},
    ML + "runs/delete-tag": {"POST": run_write(404)},
    ML + "runs/log-inputs": {"POST": run_write(200)},
    ML + "runs/delete": {"POST": run_write(200)},
    ML + "runs/restore": {"POST": run_write(200)},
    ML + "metrics/get-history": {"GET": mlflow_read()},
    # MLflow 3 logged models: the world's model was logged by the Job's Run (its creator); its writers are the
    # model's creator, Project admins and the Run's writers (so its Run token); a Run token searches its own experiment.
    ML + "runs/outputs": {"POST": run_write(200)},
    ML + "runs/log-model": {"POST": run_write(200)},
    ML + "logged-models": {"POST": run_write(200)},  # with the Run as source_run_id: writers of that Run
    ML + "logged-models/search": {"GET": api_list(tokens=200), "POST": api_list(tokens=200)},
    ML + "logged-models/<str:model_id>": {"GET": mlflow_read(), "PATCH": run_write(200), "DELETE": run_write(200)},
    ML + "logged-models/<str:model_id>/tags": {"PATCH": run_write(200)},
    ML + "logged-models/<str:model_id>/tags/<path:tag_key>": {"DELETE": run_write(404)},  # the tag is absent
    ML + "logged-models/<str:model_id>/params": {"POST": run_write(200)},
    ML + "logged-models/<str:model_id>/artifacts/directories": {"GET": mlflow_read()},
    # The model registry: members register and edit, admins rename, delete and move aliases. Creating a model needs no
    # Project (its first version places it), so anyone signed in may; a Run token makes it in its Run's Project and
    # registers versions of its own Run only (log_model(registered_model_name=...) in a Job); other endpoints refuse it.
    ML + "registered-models/create": {"POST": answers(401, 200, 200, 200, 200, 200, 200, 200, 200)},
    ML + "registered-models/get": {"GET": mlflow_read(tokens=403)},
    ML + "registered-models/update": {"PATCH": member_write(200)},
    ML + "registered-models/rename": {"POST": admin_only(200)},
    ML + "registered-models/delete": {"DELETE": admin_only(200)},
    ML + "registered-models/search": {"GET": api_list()},
    ML + "registered-models/get-latest-versions": {"GET": mlflow_read(tokens=403), "POST": mlflow_read(tokens=403)},
    ML + "registered-models/set-tag": {"POST": member_write(200)},
    ML + "registered-models/delete-tag": {"DELETE": member_write(200)},  # the tag is absent: a no-op, as on MLflow
    ML + "registered-models/alias": {
        "GET": mlflow_read(tokens=403),
        "POST": admin_only(200),
        "DELETE": admin_only(200),
    },
    ML + "model-versions/create": {"POST": member_write(200) | {"own_token": 200}},
    ML + "model-versions/get": {"GET": mlflow_read(tokens=403)},
    ML + "model-versions/update": {"PATCH": member_write(200)},
    ML + "model-versions/delete": {"DELETE": admin_only(200)},
    ML + "model-versions/search": {"GET": api_list()},
    ML + "model-versions/get-download-uri": {"GET": mlflow_read(tokens=403)},
    ML + "model-versions/set-tag": {"POST": member_write(200)},
    ML + "model-versions/delete-tag": {"DELETE": member_write(200)},  # the tag is absent: a no-op, as on MLflow
    ML + "model-versions/transition-stage": {"POST": answers(401, 400, 400, 400, 400, 400, 400, 403, 403)},
    "api/^(?P<rest>2\\.0/mlflow/.*|3\\.0/mlflow/.*)$": {"GET": answers(*(404,) * 9), "POST": answers(*(404,) * 9)},
    # --- MLflow artifact API ------------------------------------------------------------------------
    ART + "artifacts": {"GET": mlflow_read()},
    ART + "^artifacts/(?P<artifact_path>[\\s\\S]+)\\Z": {
        "GET": mlflow_read(),
        "PUT": run_write(200),
        "DELETE": admin_only(200),
    },
    ART + "^mpu/(?P<action>[a-z]+)/(?P<artifact_path>[\\s\\S]+)\\Z": {"POST": run_write(501)},
    # --- pages --------------------------------------------------------------------------------------
    # Operators' endpoints: no login; /metrics also answers every role here (the test client calls from loopback).
    "healthz": {"GET": answers(*(200,) * 9)},
    "readyz": {"GET": answers(*(200,) * 9)},
    "metrics": {"GET": answers(*(200,) * 9)},
    "accounts/login/": {"GET": answers(200, 302, 302, 302, 302, 302, 302, 200, 200)},
    "accounts/logout/": {"POST": answers(*(302,) * 9)},
    # Single sign-on is not configured in the matrix's world (tests/e2e/test_oidc_sign_in.py configures it).
    "oidc/authenticate/": {"GET": answers(*(404,) * 9)},
    "oidc/callback/": {"GET": answers(*(404,) * 9)},
    "i18n/setlang/": {"POST": answers(*(302,) * 9)},
    "": {"GET": answers(302, 200, 200, 200, 200, 200, 200, 302, 302)},
    "projects/<slug:slug>/": {"GET": page_read()},
    "projects/<slug:slug>/runs.csv": {"GET": page_read()},
    "projects/<slug:slug>/compare/": {"GET": page_read()},
    "projects/<slug:slug>/columns/": {"POST": page_read(302)},  # each reader's own choice of table columns
    "projects/<slug:slug>/members/": {"GET": page(403, 403, 403, 200), "POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/members/<str:username>/role/": {"POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/members/<str:username>/remove/": {"POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/audit/": {"GET": page(403, 403, 403, 200)},
    "projects/<slug:slug>/service-accounts/": {"POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/service-accounts/<slug:name>/tokens/": {"POST": page(403, 403, 403, 200)},
    "projects/<slug:slug>/service-accounts/<slug:name>/tokens/<int:token_id>/revoke/": {
        "POST": page(403, 403, 403, 302)
    },
    "projects/<slug:slug>/audit.csv": {"GET": page(403, 403, 403, 200)},
    "projects/<slug:slug>/sweeps/": {"GET": page_read()},
    "projects/<slug:slug>/sweeps/new/": {"GET": page_read(), "POST": page(403, 302, 302, 302)},
    "sweeps/<int:pk>/": {"GET": page_read()},
    "runs/<int:pk>/": {"GET": page_read()},
    "runs/<int:pk>/charts/": {"GET": page_read()},
    "runs/<int:pk>/system/": {"GET": page_read()},
    "runs/<int:pk>/data-history/": {"GET": page_read(), "POST": page(403, 403, 302, 302)},
    "runs/<int:pk>/checkpoints/": {"GET": page_read()},
    "runs/<int:pk>/artifacts/": {"GET": page_read()},
    "runs/<int:pk>/logs/": {"GET": page_read()},
    "runs/<int:pk>/log/": {"GET": page_read()},
    "runs/<int:pk>/artifacts/delete/": {"GET": page_read(), "POST": page(403, 403, 403, 302)},
    "checkpoints/<int:pk>/": {"GET": page_read()},
    "checkpoints/<int:pk>/delete/": {"GET": page_read(), "POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/storage/": {"GET": page_read()},
    "projects/<slug:slug>/storage/policy/": {"POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/storage/apply/": {"POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/checkpoints/bulk-delete/": {
        "GET": page(403, 403, 403, 200),
        "POST": page(403, 403, 403, 302),
    },
    "checkpoints/<int:pk>/resume/": {"GET": page_read(), "POST": page(403, 403, 409, 409)},
    "checkpoints/<int:pk>/continue/": {"GET": page_read(), "POST": page(403, 302, 302, 302)},
    "projects/<slug:slug>/models/": {"GET": page_read()},
    "models/<int:pk>/": {"GET": page_read()},
    # Aliases and deletions are the Project admins' (docs/api.md#model-registry).
    "models/<int:pk>/aliases/": {"POST": page(403, 403, 403, 302)},
    "models/<int:pk>/aliases/<str:alias>/delete/": {"POST": page(403, 403, 403, 302)},
    "models/<int:pk>/versions/<int:version>/delete/": {"POST": page(403, 403, 403, 302)},
    "checkpoints/<int:pk>/register/": {"GET": page_read(), "POST": page(403, 302, 302, 302)},
    "projects/<slug:slug>/jobs/": {"GET": page_read()},
    "projects/<slug:slug>/jobs/table/": {"GET": page_read()},
    "projects/<slug:slug>/jobs/new/": {"GET": page_read(), "POST": page(403, 302, 302, 302)},
    "jobs/<int:pk>/": {"GET": page_read()},
    "jobs/<int:pk>/live/": {"GET": page_read()},
    "jobs/<int:pk>/abort/": {"POST": page(403, 403, 302, 302)},
    "jobs/<int:pk>/resume-latest/": {"POST": page(403, 403, 302, 302)},
    "projects/<slug:slug>/alerts/": {"GET": page(403, 200, 200, 200)},
    # The matrix's rule is a Project rule (admins add and delete those; members subscribe, tested in tests/alerts).
    "projects/<slug:slug>/alerts/rules/": {"POST": page(403, 403, 403, 302)},
    "alert-rules/<int:pk>/delete/": {"POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/alerts/channels/": {"POST": page(403, 403, 403, 302)},
    "alert-channels/<int:pk>/send-test/": {"POST": page(403, 403, 403, 302)},
    "alert-channels/<int:pk>/delete/": {"POST": page(403, 403, 403, 302)},
    "projects/<slug:slug>/reliability/": {"GET": page_read()},
    "admin/": {"GET": answers(302, 302, 302, 302, 302, 302, 200, 302, 302)},
    # The account page's tokens: each user sees and changes only their own (the world's token is the creator's).
    "accounts/tokens/": {"GET": answers(302, *(200,) * 6, 302, 302), "POST": answers(302, *(200,) * 6, 302, 302)},
    "accounts/tokens/<int:token_id>/revoke/": {"POST": answers(302, 404, 404, 404, 302, 404, 404, 302, 302)},
}
ROWS |= {
    # Tokens are managed with a session, a password or a token of scope admin (the default role's token here);
    # a service account's tokens by its Project's admins only.
    API + "tokens/": {
        "GET": answers(
            401,
            *(200,) * 6,
            403,
            403,
            read_token=403,
            write_token=403,
            service_account=403,
            outside_service_account=403,
        ),
        "POST": answers(
            401,
            *(201,) * 6,
            403,
            403,
            read_token=403,
            write_token=403,
            service_account=403,
            outside_service_account=403,
        ),
    },
    # Service accounts: Project admins only (an admin's read token acts as a viewer).
    API + "projects/<slug:slug>/service-accounts/": {
        "GET": admin_only(200) | {"read_token": 403},
        "POST": admin_only(201),
    },
    API + "projects/<slug:slug>/service-accounts/<slug:name>/tokens/": {"POST": admin_only(201)},
    API + "projects/<slug:slug>/service-accounts/<slug:name>/tokens/<int:token_id>/": {"DELETE": admin_only(204)},
    # The audit log: each user gets the records of the Projects they administer (none for others).
    API + "audit/": {"GET": api_list()},
    API + "tokens/<int:token_id>/": {
        "DELETE": answers(
            401,
            404,
            404,
            404,
            204,
            404,
            404,
            403,
            403,
            read_token=403,
            write_token=403,
            service_account=403,
            outside_service_account=403,
        ),
    },
}

# The MLflow API is also served under the mlflow/ prefix (MLFLOW_TRACKING_URI=http://<mado>/mlflow), alike.
ROWS |= {"mlflow/" + route: row for route, row in ROWS.items() if route.startswith(("api/2.0/", "api/^"))}

# POSTs that only read: a read token may send them.
READ_POSTS = {
    ML + "experiments/search",
    ML + "runs/search",
    ML + "logged-models/search",
    "api/^(?P<rest>2\\.0/mlflow/.*|3\\.0/mlflow/.*)$",  # an unknown MLflow path: 404 before anything
}


def scope_cells(route: str, method: str, row: dict) -> dict:
    """The token-scope and service-account cells of ``row`` (one method's answers) where the row leaves them to be
    derived."""
    if not route.startswith(("api/", "mlflow/")):
        derived = dict.fromkeys(("read_token", "write_token", "service_account", "outside_service_account"))
        derived = {role: row["anonymous"] for role in derived}
    else:
        reads = method == "GET" or route.removeprefix("mlflow/") in READ_POSTS
        derived = {
            "read_token": row["admin"] if reads else 403,
            "write_token": row["creator"],
            "service_account": row["member"],
            "outside_service_account": row["outsider"],
        }
    return {role: derived[role] if row[role] is DERIVED else row[role] for role in derived}


ROWS = {
    route: {method: cell | scope_cells(route, method, cell) for method, cell in row.items()}
    for route, row in ROWS.items()
}
