"""The ``/api/v1/`` router (docs/api.md): resource paths are a contract shared with the SDK and pages."""

from django.urls import path
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from alerts.urls import api_patterns as alert_patterns
from checkpoints.api import (
    ArtifactDetailApi,
    ArtifactListApi,
    CheckpointCompleteApi,
    CheckpointDetailApi,
    CheckpointFileApi,
    CheckpointListApi,
    CheckpointTarApi,
    CheckpointUploadPartsApi,
)
from checkpoints.api.codes import CodeVersionListApi
from checkpoints.api.retention import (
    CheckpointBulkDeleteApi,
    ProjectUsageApi,
    RetentionApplyApi,
    RetentionPolicyApi,
    RetentionPreviewApi,
    RunUsageApi,
)
from jobs.api import CheckpointContinueApi, CheckpointResumeApi, JobViewSet, QueueListApi
from mado.token_api import TokenDetailApi, TokenListApi
from parity.api import ProjectParityApi, RunResourceViewSet, RunRestoreReportApi
from runs.api.audit import AuditListApi
from runs.api.liveness import RunHeartbeatApi
from runs.api.projects import (
    CodeListApi,
    DatasetListApi,
    DatasetVersionListApi,
    MemberDetailApi,
    MemberListApi,
    ProjectViewSet,
)
from runs.api.runs import RunMetricsApi
from runs.api.service_accounts import (
    ServiceAccountListApi,
    ServiceAccountTokenDetailApi,
    ServiceAccountTokenListApi,
)
from runs.api.stages import RunDataStagesApi
from sweeps.api import SweepViewSet

app_name = "api"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents ``Authorization: Bearer <token>`` (``Token <token>`` is accepted too)."""

    target_class = "mado.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "an API token: create one on your account page"}


class BasicPasswordOrTokenScheme(OpenApiAuthenticationExtension):
    """Documents ``Authorization: Basic`` with the password, or one of the user's tokens as the password."""

    target_class = "mado.authentication.PasswordOrTokenBasicAuthentication"
    name = "basicAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "basic", "description": "username and password, or a token as the password"}


router = DefaultRouter()
router.register("projects", ProjectViewSet, basename="project")
router.register("runs", RunResourceViewSet, basename="run")  # the runs app's view with the parity facts
router.register("jobs", JobViewSet, basename="job")
router.register("sweeps", SweepViewSet, basename="sweep")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start script from ?script, not inline: the page passes the
    # Content-Security-Policy (docs/design/interfaces.md#page-security).
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api:schema", template_name="mado/api_docs.html"),
        name="docs",
    ),
    path("projects/<slug:slug>/members/", MemberListApi.as_view(), name="member-list"),
    path("projects/<slug:slug>/members/<str:username>/", MemberDetailApi.as_view(), name="member-detail"),
    path("projects/<slug:slug>/datasets/", DatasetListApi.as_view(), name="dataset-list"),
    path("datasets/<int:dataset_id>/versions/", DatasetVersionListApi.as_view(), name="dataset-version-list"),
    path("projects/<slug:slug>/codes/", CodeListApi.as_view(), name="code-list"),
    path("codes/<int:code_id>/versions/", CodeVersionListApi.as_view(), name="code-version-list"),
    path("runs/<int:run_id>/metrics/", RunMetricsApi.as_view(), name="run-metrics"),
    path("runs/<int:run_id>/heartbeat/", RunHeartbeatApi.as_view(), name="run-heartbeat"),
    path("runs/<int:run_id>/artifacts/", ArtifactListApi.as_view(), name="artifact-list"),
    path("runs/<int:run_id>/artifacts/<path:path>", ArtifactDetailApi.as_view(), name="artifact-detail"),
    path("runs/<int:run_id>/checkpoints/", CheckpointListApi.as_view(), name="checkpoint-list"),
    path("checkpoints/<int:checkpoint_id>/", CheckpointDetailApi.as_view(), name="checkpoint-detail"),
    path("checkpoints/<int:checkpoint_id>/tar", CheckpointTarApi.as_view(), name="checkpoint-tar"),
    path("checkpoints/<int:checkpoint_id>/files/<path:path>", CheckpointFileApi.as_view(), name="checkpoint-file"),
    path(
        "checkpoints/<int:checkpoint_id>/upload-parts/",
        CheckpointUploadPartsApi.as_view(),
        name="checkpoint-upload-parts",
    ),
    path("checkpoints/<int:checkpoint_id>/complete/", CheckpointCompleteApi.as_view(), name="checkpoint-complete"),
    path("checkpoints/<int:checkpoint_id>/resume/", CheckpointResumeApi.as_view(), name="checkpoint-resume"),
    path("checkpoints/<int:checkpoint_id>/continue/", CheckpointContinueApi.as_view(), name="checkpoint-continue"),
    path("runs/<int:run_id>/data-stages/", RunDataStagesApi.as_view(), name="run-data-stages"),
    path("runs/<int:run_id>/restore-report/", RunRestoreReportApi.as_view(), name="run-restore-report"),
    path("projects/<slug:slug>/parity/", ProjectParityApi.as_view(), name="project-parity"),
    path("projects/<slug:slug>/usage/", ProjectUsageApi.as_view(), name="project-usage"),
    path("runs/<int:run_id>/usage/", RunUsageApi.as_view(), name="run-usage"),
    path("projects/<slug:slug>/retention-policy/", RetentionPolicyApi.as_view(), name="retention-policy"),
    path("projects/<slug:slug>/retention-policy/preview/", RetentionPreviewApi.as_view(), name="retention-preview"),
    path("projects/<slug:slug>/retention-policy/apply/", RetentionApplyApi.as_view(), name="retention-apply"),
    path(
        "projects/<slug:slug>/checkpoints/bulk-delete/",
        CheckpointBulkDeleteApi.as_view(),
        name="checkpoint-bulk-delete",
    ),
    path("queues/", QueueListApi.as_view(), name="queue-list"),
    *alert_patterns,
    path("tokens/", TokenListApi.as_view(), name="token-list"),
    path("audit/", AuditListApi.as_view(), name="audit-list"),
    path("projects/<slug:slug>/service-accounts/", ServiceAccountListApi.as_view(), name="service-account-list"),
    path(
        "projects/<slug:slug>/service-accounts/<slug:name>/tokens/",
        ServiceAccountTokenListApi.as_view(),
        name="service-account-token-list",
    ),
    path(
        "projects/<slug:slug>/service-accounts/<slug:name>/tokens/<int:token_id>/",
        ServiceAccountTokenDetailApi.as_view(),
        name="service-account-token-detail",
    ),
    path("tokens/<int:token_id>/", TokenDetailApi.as_view(), name="token-detail"),
    *router.urls,
]
