"""API views of the parity app (docs/api.md "Resume parity"; docs/design/resume.md#restore-report, #parity).

``runs/`` and ``runs/{id}/`` answer the Run resource with ``restore_report``,
``resume_ignored_at_step`` and ``parity`` (``RunResourceViewSet``, routed in
``config.api_urls`` in place of the runs app's view); ``runs/{id}/restore-report/``
takes the SDK's report; ``projects/{slug}/parity/`` reads and sets the
Project's tolerance. Thin (docs/design/house.md#views): a selector fetches
(another Project's object → 404), one service checks and writes.
"""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from parity import selectors, services
from parity.serializers import RestoreReportOutputSerializer, RunResourceOutputSerializer
from runs import selectors as run_selectors
from runs.api.runs import RunViewSet
from runs.api.serializers import FENCING_PARAMETER
from runs.lease import fencing_token

TAGS = ["resume parity"]
_RUN_ID = OpenApiParameter("run_id", int, OpenApiParameter.PATH, description="run id")
_SLUG = OpenApiParameter("slug", str, OpenApiParameter.PATH, description="project slug")


@extend_schema_view(
    list=extend_schema(responses=RunResourceOutputSerializer(many=True)),
    create=extend_schema(
        responses={
            201: RunResourceOutputSerializer,
            200: OpenApiResponse(RunResourceOutputSerializer, description="attached to a pending Run, or resumed"),
            400: OpenApiResponse(description="bad field (named): external_id, resume, host, pid..."),
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="resume=must: run <id> not found in project <slug>"),
            409: OpenApiResponse(
                description="external_id taken (never), run_live (another process heartbeats), or a changed "
                "parameters.<key>"
            ),
        }
    ),
    retrieve=extend_schema(responses=RunResourceOutputSerializer),
    partial_update=extend_schema(
        responses={
            200: RunResourceOutputSerializer,
            403: OpenApiResponse(description="viewer"),
            409: OpenApiResponse(description="refused transition (ended, preempting) or lease_lost"),
        }
    ),
)
class RunResourceViewSet(RunViewSet):
    """``runs/`` and ``runs/{id}/`` with what each Run restored from its checkpoint and its parity verdict."""

    output_serializer = RunResourceOutputSerializer

    def output_queryset(self, runs):
        return (
            super()
            .output_queryset(runs)
            .select_related("parity", "restore_report", "source_checkpoint")
            .prefetch_related("parameter_changes", "data_stages", "resume_segments")
        )


class RestoreReportInputSerializer(serializers.Serializer):
    """Documentation only: the body is checked by ``clean_restore_report``, which names each bad field."""

    checkpoint_id = serializers.IntegerField(allow_null=True, required=False, help_text="the checkpoint loaded")
    parts = serializers.DictField(
        child=serializers.ChoiceField(choices=["restored", "not_restored", "unknown"]),
        help_text="model, optimizer, scheduler, scaler, rng.python, rng.numpy, rng.torch, rng.cuda.<device>, "
        "generator.<name>, data_position, global_step → restored | not_restored | unknown",
    )
    details = serializers.DictField(
        child=serializers.CharField(max_length=500), required=False, help_text="one line per part listed in parts"
    )


class RunRestoreReportApi(APIView):
    """``runs/{id}/restore-report/``: what the resumed Run's code restored from its checkpoint."""

    @extend_schema(
        tags=TAGS,
        parameters=[_RUN_ID, FENCING_PARAMETER],
        request=RestoreReportInputSerializer,
        responses={
            201: RestoreReportOutputSerializer,
            200: OpenApiResponse(RestoreReportOutputSerializer, description="replaced the Run's earlier report"),
            400: OpenApiResponse(description="bad field (named): parts.<part>, details.<part>, checkpoint_id…"),
            403: OpenApiResponse(description="not a writer of the run"),
            404: OpenApiResponse(description="run not visible"),
            409: OpenApiResponse(description="lease_lost (stale fencing token)"),
        },
    )
    def post(self, request, run_id):
        """Store ``{checkpoint_id, parts: {part: restored | not_restored | unknown}, details?: {part: line}}``.

        One report per Run: 201 the first, 200 a later one, which replaces it
        (a retry, or the SDK's second look before the first step). Writers
        of the Run only; fenced by ``Mado-Fencing-Token``.
        """
        run = run_selectors.run_get_for_user(user=request.user, run_id=run_id, related=("project",))
        report, created = services.restore_report_record(
            actor=request.user, run=run, body=request.data, fencing_token=fencing_token(request)
        )
        return Response(
            RestoreReportOutputSerializer(report).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class ParitySettingsSerializer(serializers.Serializer):
    tolerance = serializers.FloatField(
        help_text="relative difference (0 to 1) a resumed run's value may differ from its parent's and still be "
        "within tolerance: |child - parent| <= tolerance * max(|child|, |parent|); default 1e-6"
    )


class ProjectParityApi(APIView):
    """``projects/{slug}/parity/``: the Project's parity tolerance; any member reads it, admins set it."""

    @extend_schema(tags=TAGS, parameters=[_SLUG], responses=ParitySettingsSerializer)
    def get(self, request, slug):
        """``{tolerance}``: the relative tolerance of the Project's parity verdicts."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        return Response({"tolerance": selectors.project_tolerance(project_id=project.pk)})

    @extend_schema(
        tags=TAGS,
        parameters=[_SLUG],
        request=ParitySettingsSerializer,
        responses={
            200: ParitySettingsSerializer,
            400: OpenApiResponse(description="tolerance not a number from 0 to 1"),
            403: OpenApiResponse(description="not a project admin"),
        },
    )
    def patch(self, request, slug):
        """Set ``{tolerance}`` (0 to 1; admins only); every verdict of the Project is compared again with it."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        body = request.data if isinstance(request.data, dict) else {}
        settings = services.parity_tolerance_set(actor=request.user, project=project, tolerance=body.get("tolerance"))
        return Response({"tolerance": settings.tolerance})
