"""``runs/{id}/heartbeat/``: the SDK's sign of life for a running Run (docs/design/runs.md#states; docs/api.md).

Thin (docs/design/house.md#views): the Run is fetched through ``run_get_for_user`` (another
Project's Run → 404); the one service ``runs.liveness.run_heartbeat`` checks
the role (viewer → 403), the fencing token (stale → 409 ``lease_lost``) and
the state (ended → 409 ``run_ended``, pending → 409 ``conflict``).
"""

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import selectors
from runs.api.serializers import FENCING_PARAMETER
from runs.lease import fencing_token
from runs.liveness import run_heartbeat


class RunHeartbeatOutputSerializer(serializers.Serializer):
    status = serializers.CharField(read_only=True, help_text="running or preempting")
    heartbeat_at = serializers.DateTimeField(read_only=True)
    heartbeat_interval = serializers.IntegerField(read_only=True, help_text="seconds until the next heartbeat is due")


class RunHeartbeatApi(APIView):
    """``POST runs/{id}/heartbeat/``: mark the Run alive now."""

    @extend_schema(
        tags=["runs"],
        request=None,
        parameters=[
            OpenApiParameter("run_id", int, OpenApiParameter.PATH, description="run id"),
            FENCING_PARAMETER,
        ],
        responses={
            200: RunHeartbeatOutputSerializer,
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="run not visible"),
            409: OpenApiResponse(description="run_ended (resume it to continue), lease_lost, or conflict (pending)"),
        },
    )
    def post(self, request, run_id):
        """``heartbeat_at`` = now for a running or preempting Run; 200 ``{status, heartbeat_at, heartbeat_interval}``.

        A Run silent for ``MMT_CRASH_TIMEOUT`` s becomes ``crashed``; a crashed
        Run answers 409 ``run_ended`` here and runs again only through a resume.
        """
        run = selectors.run_get_for_user(user=request.user, run_id=run_id)
        run = run_heartbeat(actor=request.user, run=run, fencing_token=fencing_token(request))
        return Response(
            RunHeartbeatOutputSerializer(
                {
                    "status": run.status,
                    "heartbeat_at": run.heartbeat_at,
                    "heartbeat_interval": settings.MMT_HEARTBEAT_INTERVAL,
                }
            ).data
        )
