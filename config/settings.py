"""mado settings: one module, driven by environment variables (docs/design/house.md#settings).

The embedded default needs no external service: SQLite and stored files under
``MADO_DATA_DIR`` (default ``./var``) and a Celery transport on the local
filesystem. Production sets ``MADO_DATABASE_URL`` (PostgreSQL),
``MADO_STORAGE=s3`` and ``CELERY_BROKER_URL`` (Redis or RabbitMQ); see
``docs/deploy.md``.
"""

import os
import signal
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from mado.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_network_ports,
    env_networks,
    env_signal,
    env_str,
    env_url,
)
from mado_tracking.hashing import hash_threads
from mado_tracking.tarformat import Limits as TarLimits

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("MADO_DATA_DIR", str(BASE_DIR / "var"))).resolve()

DEBUG = env_bool("MADO_DEBUG", False)
# Production sets its own key; without one, web, worker, beat and migrate refuse to start unless MADO_DEBUG=1
# (mado/checks.py: ``require_secret_key`` at start, ``mado.E001`` in ``check --deploy``). MADO_ROLE names the
# process's role: the image's entry point sets it to its sub-command (deploy/entrypoint.sh).
MADO_SECRET_KEY_SET = bool(env_str("MADO_SECRET_KEY"))
MADO_ROLE = env_str("MADO_ROLE", "")
SECRET_KEY = env_str("MADO_SECRET_KEY") or "insecure-local-development-key-set-MADO_SECRET_KEY"
ALLOWED_HOSTS = env_list("MADO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("MADO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "mozilla_django_oidc",
    "axes",
    "mado",
    "runs",
    "sweeps",
    "checkpoints",
    "parity",
    "jobs",
    "alerts",
    "mlflow_api",
    "worker",
    "config",  # the roof: its management commands
]

MIDDLEWARE = [
    # Every line a request logs carries its id (X-Request-ID), and its time is measured (docs/deploy.md#logs).
    "mado.logs.RequestIdMiddleware",
    "config.metrics.RequestMetricsMiddleware",
    # Outermost: a database, broker or storage outage raised by a view answers 503, not an HTML 500
    # (errors raised inside the other middleware go to mado.outages.server_error, the handler500).
    "mado.outages.OutageMiddleware",
    # Outside everything that answers early (probes, outages, static files): every response carries both
    # policies (docs/design/interfaces.md#page-security).
    "csp.middleware.CSPMiddleware",
    "mado.page_headers.PermissionsPolicyMiddleware",
    # /healthz, /readyz and /metrics answer before host validation and the HTTPS redirect: probes send neither.
    "config.ops.OperatorEndpointsMiddleware",
    # The request's address and id, for the audit records its writes leave (docs/api.md#audit).
    "mado.audit.AuditContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A sign-in refused for too many failures answers 429 (API) or the login page's message (mado.signins).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = env_str("MADO_DATABASE_URL") or f"sqlite:///{DATA_DIR / 'mado.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=env_int("MADO_DB_CONN_MAX_AGE", 60))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # WAL lets the web server read while the worker writes; the busy timeout
    # turns short lock waits into waits rather than "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs:project-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("ja", "日本語")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The image collects static files at build time into a folder of its own (deploy/Dockerfile), not the data volume.
STATIC_ROOT = Path(env_str("MADO_STATIC_ROOT", str(DATA_DIR / "static"))).resolve()
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every request when it is missing
# npm packages served as they are installed (package.json): htmx for live parts, uPlot for the charts.
NPM_DIST_DIRS = [BASE_DIR / "node_modules" / name / "dist" for name in ("htmx.org", "uplot")]
STATICFILES_DIRS = [BASE_DIR / "static", *[d for d in NPM_DIST_DIRS if d.is_dir()]]
# Serve static files straight from the app and static folders (no collectstatic step needed).
WHITENOISE_USE_FINDERS = True

# --- artifact storage -------------------------------------------------------
MADO_STORAGE = env_choice("MADO_STORAGE", "file", ("file", "s3"))
if MADO_STORAGE == "s3":
    _artifacts = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": env_str("MADO_S3_BUCKET", "mado-artifacts"),
            "endpoint_url": env_str("MADO_S3_ENDPOINT_URL"),
            "region_name": env_str("MADO_S3_REGION"),
            "access_key": env_str("MADO_S3_ACCESS_KEY_ID"),
            "secret_key": env_str("MADO_S3_SECRET_ACCESS_KEY"),
            "location": env_str("MADO_S3_PREFIX", ""),
            "file_overwrite": False,
            "default_acl": None,
        },
    }
else:
    _artifacts = {
        "BACKEND": "checkpoints.filesystem.DurableFileSystemStorage",
        "OPTIONS": {"location": str(DATA_DIR / "artifacts")},
    }
STORAGES = {
    "default": _artifacts,
    "artifacts": _artifacts,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# --- API ----------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "mado.authentication.BearerTokenAuthentication",
        "mado.authentication.PasswordOrTokenBasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # RunTokenScope: a Job's token (MMT_API_TOKEN) acts on its own Run only (docs/api.md).
    # TokenScopeAllows: a read-scoped token reads only (docs/api.md#tokens).
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "mado.authentication.RunTokenScope",
        "mado.authentication.TokenScopeAllows",
    ],
    # The browsable API, read-only: DRF's generated forms need a serializer_class the views do not declare.
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "mado.browsable_api.ReadOnlyBrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "mado.pagination.DefaultPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "mado.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
from config.sign_in_settings import *  # noqa: E402, F403 - who signs in and how, a module of its own

SPECTACULAR_SETTINGS = {
    "TITLE": "mado API",
    "DESCRIPTION": "Runs, metrics, artifacts, checkpoints and jobs. Auth: `Authorization: Bearer <token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI's files come from drf-spectacular-sidecar's static files, not a CDN: the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Runs and Jobs both have a "kind" and a "status": name each choice set once.
    "ENUM_NAME_OVERRIDES": {
        "RunKindEnum": "runs.models.RunKind",
        "RunStatusEnum": "runs.models.RunStatus",
        "JobKindEnum": "jobs.models.JobKind",
        "JobStatusEnum": "jobs.models.JobStatus",
        "SweepTrialStateEnum": "sweeps.models.TrialState",
        "CheckpointStateEnum": "checkpoints.models.CheckpointState",
        "AlertChannelKindEnum": "alerts.models.ChannelKind",
        "AlertEventEnum": "alerts.models.Event",
        "AlertDeliveryStatusEnum": "alerts.models.DeliveryStatus",
    },
}

# --- Celery -------------------------------------------------------------------
_broker_dir = DATA_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://localhost//")
if CELERY_BROKER_URL.startswith("filesystem"):
    for _folder in ("queue", "processed"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
# Jobs run for hours (docs/design/worker.md#subprocess) but are fenced by their claim and heartbeat, so the broker only
# has to get each message to some worker once (docs/deploy.md, "Messages and outages"): - outbox: services write a
# Dispatch row in their transaction (mado/outbox.py); it is sent after commit and, while the broker is down, again by
# beat (``mado.tasks.flush_dispatches``); - prefetch 1 and late ack: a worker reserves only the task it runs; a task
# that never finished is delivered again (reject_on_worker_lost: also when its pool process was killed); - the
# visibility timeout is sized to the heartbeat, not to the longest Job: Redis re-delivers an unacknowledged message
# after it, and a re-delivered run_job finds its Job claimed (job_claim's conditional UPDATE queued → running lets
# exactly one delivery run the code); a Job whose worker died is failed by the heartbeat reaper, never started again
# behind the user's back; - a Job that no worker claimed MADO_DISPATCH_TIMEOUT s after its message went out is sent once
# more, then failed saying why (``mado.tasks.reap_undelivered``).
MADO_JOB_HEARTBEAT_TIMEOUT = env_int("MADO_JOB_HEARTBEAT_TIMEOUT", 120, minimum=10)
MADO_BROKER_VISIBILITY_TIMEOUT = env_int("MADO_BROKER_VISIBILITY_TIMEOUT", 2 * MADO_JOB_HEARTBEAT_TIMEOUT, minimum=5)
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # broadcast tables (revoke, ping) go here too, not into the current directory
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # kombu polls the folder; the default 1 s would add up to a second to every dispatch
        "polling_interval": 0.1,
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    # A send after commit never holds a request or a Job: a refused connection fails at once (no retries:
    # kombu would retry for the whole connect timeout, the outbox sends later instead) and a silent host
    # within socket_connect_timeout; every worker looks for messages past the visibility timeout every
    # 10 s (kombu's default: every 100 s).
    else {
        "max_retries": 0,
        "visibility_timeout": MADO_BROKER_VISIBILITY_TIMEOUT,
        "socket_connect_timeout": 5,
        "socket_timeout": 10,
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
    }
)
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A busy worker reserves no message beyond the Jobs it runs, also after a broker reconnect (where the prefetch
# count alone let it take one more, which then waited for the redelivery while another worker sat idle).
# Celery supports this on Redis only (it warns on other brokers).
CELERY_WORKER_DISABLE_PREFETCH = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
# A worker keeps trying to reach the broker, at start and after losing it, for as long as it takes;
# the Job it runs meanwhile talks to the database only (heartbeat, logs, outcome).
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CONNECTION_TIMEOUT = 5
# A send that fails is tried once more at once, on a new connection (the pooled one may be a dead one left by a
# broker restart), never with a wait that would hold the request or the Job: the outbox sends it later.
CELERY_TASK_PUBLISH_RETRY = True
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}
# The longest one send to the broker may take, connecting included, in seconds (mado.outbox.broker_call; docs/deploy.md,
# "Messages, workers and outages"): the timeouts above bound each step of a send, not the send, and a broker that
# accepts connections but never answers would hold the request for several of them. Past it the message stays in the
# outbox, as when the broker refuses, and beat's flush sends it later.
MADO_BROKER_SEND_TIMEOUT_S = env_float("MADO_BROKER_SEND_TIMEOUT_S", 3.0, minimum=0.1)
if MADO_BROKER_SEND_TIMEOUT_S > 60:
    raise ImproperlyConfigured(
        f"MADO_BROKER_SEND_TIMEOUT_S={MADO_BROKER_SEND_TIMEOUT_S:g} must be <= 60 (a request may wait that long)"
    )
CELERY_TASK_DEFAULT_QUEUE = env_str("MADO_DEFAULT_QUEUE", "cpu")
CELERY_TASK_ALWAYS_EAGER = env_bool("MADO_CELERY_EAGER", False)
# Periodic work goes to this queue (default: the default queue); some worker must consume it.
MADO_MAINTENANCE_QUEUE = env_str("MADO_MAINTENANCE_QUEUE", CELERY_TASK_DEFAULT_QUEUE)
# Seconds between two runs of each periodic check (reapers, janitors, the outbox flush).
MADO_REAPER_INTERVAL = env_int("MADO_REAPER_INTERVAL", 60, minimum=1)
MADO_DISPATCH_TIMEOUT = env_int("MADO_DISPATCH_TIMEOUT", 24 * 3600, minimum=1)
# Each app schedules its periodic checks itself (mado.periodic, from its AppConfig.ready()).

# --- mado ---------------------------------------------------------------------
MADO_METRIC_BATCH_MAX = env_int("MADO_METRIC_BATCH_MAX", 10_000, minimum=1)
MADO_METRIC_HISTORY_PAGE_MAX = env_int("MADO_METRIC_HISTORY_PAGE_MAX", 100_000, minimum=1)
# PostgreSQL statement timeout of metric reads (keys, history pages), milliseconds: a read never holds a web
# worker longer than this, whatever the run's size (docs/deploy.md).
MADO_READ_STATEMENT_TIMEOUT_MS = env_int("MADO_READ_STATEMENT_TIMEOUT_MS", 10_000, minimum=1)
MMT_CHECKPOINT_KEEP_COUNT = env_int("MMT_CHECKPOINT_KEEP_COUNT", 5, minimum=1)
# Direct checkpoint uploads to S3 (MADO_STORAGE=s3): part size in bytes (S3 needs >= 5 MiB; we use >= 8 MiB),
# lifetime of the presigned part URLs in seconds, and the Celery queue of the verification task.
MADO_CHECKPOINT_PART_SIZE = env_int("MADO_CHECKPOINT_PART_SIZE", 64 * 1024 * 1024, minimum=8 * 1024 * 1024)
MADO_CHECKPOINT_PRESIGN_EXPIRES = env_int("MADO_CHECKPOINT_PRESIGN_EXPIRES", 6 * 3600, minimum=60)
# The S3 address presigned URLs name, for clients outside the servers' network (docs/deploy.md#s3-seen-from-outside).
MADO_S3_PUBLIC_ENDPOINT_URL = env_url("MADO_S3_PUBLIC_ENDPOINT_URL")
MADO_CHECKPOINT_VERIFY_QUEUE = env_str("MADO_CHECKPOINT_VERIFY_QUEUE", CELERY_TASK_DEFAULT_QUEUE)
# A pending checkpoint ends ``error`` (its upload aborted) this many seconds after it was registered,
# or MADO_CHECKPOINT_ENDED_GRACE seconds after its Run ended (the janitor, checkpoints.tasks).
MADO_CHECKPOINT_UPLOAD_LEASE = env_int("MADO_CHECKPOINT_UPLOAD_LEASE", MADO_CHECKPOINT_PRESIGN_EXPIRES, minimum=1)
MADO_CHECKPOINT_ENDED_GRACE = env_int("MADO_CHECKPOINT_ENDED_GRACE", 300, minimum=0)
# The largest request body read into memory (a JSON body, a form); larger ones answer 413 naming the limit
# (docs/checkpoint-format.md#limits-settings). Tars and files stream and are not bound by it.
# Scrubbing (docs/design/checkpoints.md#scrubbing): bytes per hour beat reads back from the storage to re-verify
# complete checkpoints, oldest-verified first; 0 turns it off. On by default at 10 GiB an hour (why: the doc).
MADO_SCRUB_BYTES_PER_HOUR = env_int("MADO_SCRUB_BYTES_PER_HOUR", 10 * 1024**3, minimum=0)
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MADO_API_MAX_BODY_BYTES", 2_621_440, minimum=65_536)
# What one checkpoint tar may hold (docs/checkpoint-format.md): MADO_TAR_MAX_MEMBERS, _PATH_BYTES,
# _COMPONENT_BYTES, _DEPTH, _NAME_BYTES, _PAX_BYTES, _TOTAL_BYTES; the worker and `mado agent` read the same variables.
try:
    MADO_TAR_LIMITS = TarLimits.from_env(os.environ)
    # Threads that hash one checkpoint at once (docs/design/checkpoints.md#hash-threads): MADO_HASH_THREADS, else
    # the cores this process may use, at most 4; the worker and the SDK read the same variable.
    MADO_HASH_THREADS = hash_threads(os.environ)
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None
# Same-run resume and sweeps (docs/design/runs.md#resume-modes, #one-writer-process, #states;
# docs/design/sweeps.md#sweeps, #requeue). A running Run whose SDK sent no heartbeat for MMT_CRASH_TIMEOUT seconds
# becomes crashed (a preempting one preempted); the SDK beats every MMT_HEARTBEAT_INTERVAL seconds (told to it when it
# starts the Run). An agent's claim on a sweep trial returns to the queue when its program has not started the Run
# within MMT_SWEEP_LEASE seconds.
MMT_CRASH_TIMEOUT = env_int("MMT_CRASH_TIMEOUT", 300, minimum=1)
# A running Run that never sent a heartbeat (the MLflow client, curl) becomes crashed after this many
# seconds without any write (docs/design/runs.md#liveness); a Project may set its own (Project.silent_run_timeout).
MMT_SILENT_RUN_TIMEOUT = env_int("MMT_SILENT_RUN_TIMEOUT", 24 * 3600, minimum=1)
MMT_HEARTBEAT_INTERVAL = env_int("MMT_HEARTBEAT_INTERVAL", 30, minimum=1)
MMT_SWEEP_LEASE = env_int("MMT_SWEEP_LEASE", 3600, minimum=1)
# Jobs (docs/jobs.md). A running Job whose worker sent no heartbeat for this many seconds is
# failed by the reaper (MADO_JOB_HEARTBEAT_TIMEOUT, above); workers beat well within it.
MADO_JOB_LOG_MAX_BYTES = env_int("MADO_JOB_LOG_MAX_BYTES", 10 * 1024 * 1024, minimum=1024)  # per Run, UTF-8 bytes
MADO_JOB_KILL_GRACE = env_int("MADO_JOB_KILL_GRACE", 30, minimum=0)  # seconds between the stop signal and SIGKILL
# The signal a Job's code gets when it must stop (an abort, the worker's own stop: docs/design/worker.md#stop), a name
# such as SIGTERM, SIGINT or SIGUSR1; SIGKILL follows after MADO_JOB_KILL_GRACE seconds.
MADO_JOB_STOP_SIGNAL = env_signal("MADO_JOB_STOP_SIGNAL", signal.SIGTERM)
# Automatic restarts of a preempted Job (docs/design/resume.md#restarts): the first waits this many seconds, each next
# one twice as long, at most the maximum; a Job preempted before its first checkpoint starts again from the start only
# when MADO_JOB_RESTART_FROM_START is on (its work so far is lost).
MADO_JOB_RESTART_BACKOFF_S = env_float("MADO_JOB_RESTART_BACKOFF_S", 30.0, minimum=0.0)
MADO_JOB_RESTART_BACKOFF_MAX_S = env_float("MADO_JOB_RESTART_BACKOFF_MAX_S", 600.0, minimum=0.0)
MADO_JOB_RESTART_FROM_START = env_bool("MADO_JOB_RESTART_FROM_START", False)
for _name in ("MADO_JOB_RESTART_BACKOFF_S", "MADO_JOB_RESTART_BACKOFF_MAX_S"):
    if not 0 <= globals()[_name] <= 24 * 3600:  # also refuses nan and inf
        raise ImproperlyConfigured(f"{_name}={globals()[_name]:g} must be a number of seconds from 0 to 86400")
# The API URL the Job's code talks to (MMT_API_URL); must be reachable from the worker hosts.
MADO_PUBLIC_URL = env_str("MADO_PUBLIC_URL", "http://127.0.0.1:8000")
# GPUs of this worker host for the code (worker/container.py): "0,1" (indexes or GPU-UUIDs) →
# CUDA_VISIBLE_DEVICES / docker --gpus; "all"; "none" (hide every GPU); "" = the worker's own
# CUDA_VISIBLE_DEVICES, if any. Checked at startup (worker/apps.py).
MADO_WORKER_GPUS = env_str("MADO_WORKER_GPUS", "")
# Where the worker makes each Job's working directory (<workdir>/job-<id>: code, checkpoint); removed after the Job.
MADO_WORKER_WORKDIR = Path(env_str("MADO_WORKER_WORKDIR", str(DATA_DIR / "jobs"))).resolve()

# --- alerts (docs/deploy.md#alerts) --------------------------------------------
# Outgoing email (alert channels, personal subscriptions): Django's SMTP backend; the password may come from a file.
EMAIL_BACKEND = env_str("MADO_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("MADO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("MADO_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("MADO_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env_str("MADO_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("MADO_EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("MADO_EMAIL_TIMEOUT", 20, minimum=1)
DEFAULT_FROM_EMAIL = env_str("MADO_EMAIL_FROM", "mado@localhost")
# Webhook URLs may not resolve to loopback, private, link-local, metadata or other special-purpose addresses, except
# these addresses or CIDRs, each on every port or on the one it names (10.0.0.5:8443, [2001:db8::/32]:443).
MADO_ALERT_WEBHOOK_ALLOW = env_network_ports("MADO_ALERT_WEBHOOK_ALLOW", [])
# A failed delivery is tried again after this many seconds, doubled each time (at most 1 h), up to this many attempts.
MADO_ALERT_RETRY_SECONDS = env_int("MADO_ALERT_RETRY_SECONDS", 30, minimum=1)
MADO_ALERT_MAX_ATTEMPTS = env_int("MADO_ALERT_MAX_ATTEMPTS", 10, minimum=1)
# Alerts a Run's code may send (run.alert) per minute; more answer 429.
MADO_ALERT_RUN_RATE = env_int("MADO_ALERT_RUN_RATE", 6, minimum=1)
# Each web process keeps a Project's metric rules this many seconds (a changed rule applies within that time).
MADO_ALERT_RULE_CACHE_SECONDS = env_int("MADO_ALERT_RULE_CACHE_SECONDS", 10, minimum=0)

# --- production hardening (manage.py check --deploy is clean when set) -------
SECURE_SSL_REDIRECT = env_bool("MADO_SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("MADO_SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int("MADO_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = SECURE_HSTS_SECONDS > 0
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("MADO_BEHIND_TLS_PROXY", False) else None

# --- pages in the browser (docs/design/interfaces.md#page-security, docs/deploy.md#browser-policies) ----------------
# django-csp's Content-Security-Policy on every response: scripts, styles, fonts and requests from this server
# only; no inline script, event handler, <style> or style attribute runs (the templates have none; Swagger UI is
# served through the split view and templates/mado/api_docs.html, the browsable API by mado/browsable_api.py, the
# Django admin as it is). uPlot, Swagger UI and Django admin's scripts set element.style, which CSP allows.
# data: images: Swagger UI's icons and the pages' empty favicon.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
# Page sessions in the database under a digest of their key: a copy of the table signs nobody in (mado/sessions.py).
SESSION_ENGINE = "mado.sessions"
# Browser features no page uses, refused to every page and frame (Permissions-Policy, mado/page_headers.py).
MADO_PERMISSIONS_POLICY_OFF = (
    "accelerometer",
    "autoplay",
    "camera",
    "display-capture",
    "encrypted-media",
    "geolocation",
    "gyroscope",
    "hid",
    "idle-detection",
    "magnetometer",
    "microphone",
    "midi",
    "payment",
    "publickey-credentials-get",
    "screen-wake-lock",
    "serial",
    "usb",
    "xr-spatial-tracking",
)

# --- operators (docs/deploy.md#health-and-metrics, #logs) ----------------------------------------------------------
# /readyz: seconds each of the database, broker and storage checks may take before it counts as down.
MADO_READYZ_TIMEOUT_S = env_float("MADO_READYZ_TIMEOUT_S", 3.0, minimum=0.1)
# /metrics answers a caller with this bearer token, or from these networks (default: this host only).
MADO_METRICS_TOKEN = env_str("MADO_METRICS_TOKEN") or ""
MADO_METRICS_ALLOW_FROM = env_networks("MADO_METRICS_ALLOW_FROM", ["127.0.0.1/32", "::1/128"])
# A Celery worker serves its own metrics (verifications, periodic checks) on this port; 0 = not served.
MADO_METRICS_PORT = env_int("MADO_METRICS_PORT", 0, minimum=0)
# "json": one JSON object per line (time, level, logger, message, request_id); "text": plain lines.
MADO_LOG_FORMAT = env_choice("MADO_LOG_FORMAT", "text", ("text", "json"))
_json_logs = MADO_LOG_FORMAT == "json"
# Celery would replace the root logger's handlers with its own plain-text ones.
CELERY_WORKER_HIJACK_ROOT_LOGGER = not _json_logs

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "mado.logs.RequestIdFilter"}},
    "formatters": {
        # Only when asked for, so a process that logs plain text never imports the JSON formatter.
        **(
            {
                "json": {
                    "()": "pythonjsonlogger.json.JsonFormatter",
                    "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
                    "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
                }
            }
            if _json_logs
            else {}
        ),
        "text": {"format": "%(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["request_id"],
            "formatter": "json" if _json_logs else "text",
        }
    },
    "root": {"handlers": ["console"], "level": env_str("MADO_LOG_LEVEL", "INFO")},
}
