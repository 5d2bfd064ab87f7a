"""The alerts API (docs/api.md "Alerts"): rules, channels, a channel's test and delivery log, a Run's own alerts.

Thin (docs/design/house.md#views): a selector fetches within the user's
Projects (another Project's object: 404), one service checks and writes.
"""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from alerts import selectors
from alerts.reliability import project_reliability, reliability_json
from alerts.serializers import (
    AlertChannelCreatedSerializer,
    AlertChannelInputSerializer,
    AlertChannelOutputSerializer,
    AlertDeliveryOutputSerializer,
    AlertRuleInputSerializer,
    AlertRuleOutputSerializer,
    RunAlertInputSerializer,
    RunAlertOutputSerializer,
)
from alerts.services import rules as services
from mado.api import PaginatedListApi, valid
from runs import selectors as run_selectors

TAGS = ["alerts"]
_SLUG = OpenApiParameter("slug", str, OpenApiParameter.PATH, description="project slug")
_REFUSED = {400: OpenApiResponse(description="a field is missing or invalid (named)"), 403: OpenApiResponse()}


class AlertRuleListApi(PaginatedListApi):
    """``projects/{slug}/alert-rules/``: the Project's rules and your subscriptions; create one."""

    @extend_schema(tags=TAGS, parameters=[_SLUG], responses=AlertRuleOutputSerializer(many=True))
    def get(self, request, slug):
        """The Project's rules and your own subscriptions (members and admins)."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        return self.paginated(selectors.rule_list(user=request.user, project=project), AlertRuleOutputSerializer)

    @extend_schema(
        tags=TAGS,
        parameters=[_SLUG],
        request=AlertRuleInputSerializer,
        responses={201: AlertRuleOutputSerializer, **_REFUSED},
    )
    def post(self, request, slug):
        """Create a Project rule (admins) or, with ``personal``, your subscription mailed to you (members)."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        rule = services.rule_create(actor=request.user, project=project, **valid(AlertRuleInputSerializer, request))
        return Response(AlertRuleOutputSerializer(rule).data, status=status.HTTP_201_CREATED)


class AlertRuleDetailApi(APIView):
    """``alert-rules/{rule_id}/``: delete a rule (a Project rule: admins; a subscription: its owner)."""

    @extend_schema(tags=TAGS, responses={204: None, 403: OpenApiResponse(), 404: OpenApiResponse()})
    def delete(self, request, rule_id):
        """Delete the rule and its firings."""
        services.rule_delete(actor=request.user, rule=selectors.rule_get_for_user(user=request.user, rule_id=rule_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class AlertChannelListApi(PaginatedListApi):
    """``projects/{slug}/alert-channels/``: the Project's channels; admins create one."""

    @extend_schema(tags=TAGS, parameters=[_SLUG], responses=AlertChannelOutputSerializer(many=True))
    def get(self, request, slug):
        """The Project's channels and whether each is failing (members and admins)."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        return self.paginated(selectors.channel_list(user=request.user, project=project), AlertChannelOutputSerializer)

    @extend_schema(
        tags=TAGS,
        parameters=[_SLUG],
        request=AlertChannelInputSerializer,
        responses={201: AlertChannelCreatedSerializer, 409: OpenApiResponse(description="name taken"), **_REFUSED},
    )
    def post(self, request, slug):
        """Create a channel (admins); a webhook's ``secret`` is in this answer only. A malformed URL, or one
        reaching a loopback, private, link-local, metadata or other special-purpose address, is refused (400 on
        ``target``)."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        channel, secret = services.channel_create(
            actor=request.user, project=project, **valid(AlertChannelInputSerializer, request)
        )
        return Response(
            {**AlertChannelOutputSerializer(channel, context={"request": request}).data, "secret": secret},
            status=status.HTTP_201_CREATED,
        )


class AlertChannelDetailApi(APIView):
    """``alert-channels/{channel_id}/``: delete a channel (admins)."""

    @extend_schema(tags=TAGS, responses={204: None, 403: OpenApiResponse(), 404: OpenApiResponse()})
    def delete(self, request, channel_id):
        """Delete the channel and its delivery log; rules stop sending to it."""
        channel = selectors.channel_get_for_user(user=request.user, channel_id=channel_id)
        services.channel_delete(actor=request.user, channel=channel)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AlertChannelTestApi(APIView):
    """``alert-channels/{channel_id}/test/``: send a test message (admins)."""

    @extend_schema(tags=TAGS, request=None, responses={202: AlertDeliveryOutputSerializer, 403: OpenApiResponse()})
    def post(self, request, channel_id):
        """Queue a test message; its delivery shows in the channel's log."""
        channel = selectors.channel_get_for_user(user=request.user, channel_id=channel_id)
        delivery = services.channel_test(actor=request.user, channel=channel)
        return Response(AlertDeliveryOutputSerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


class AlertDeliveryListApi(PaginatedListApi):
    """``alert-channels/{channel_id}/deliveries/``: the channel's delivery log, newest first (admins)."""

    @extend_schema(tags=TAGS, responses=AlertDeliveryOutputSerializer(many=True))
    def get(self, request, channel_id):
        """Each delivery: time, status, attempts, last HTTP status and error."""
        channel = selectors.channel_get_for_user(user=request.user, channel_id=channel_id)
        return self.paginated(
            selectors.delivery_list(user=request.user, channel=channel), AlertDeliveryOutputSerializer
        )


class RunAlertApi(APIView):
    """``runs/{run_id}/alerts/``: an alert from the Run's code (``run.alert``, ``mado alert``)."""

    @extend_schema(
        tags=TAGS,
        request=RunAlertInputSerializer,
        responses={
            201: RunAlertOutputSerializer,
            429: OpenApiResponse(description="too many alerts a minute"),
            **_REFUSED,
        },
    )
    def post(self, request, run_id):
        """Send ``{title, text, level}`` through the Project's ``run_alert`` rules (writers of the Run)."""
        run = run_selectors.run_get_for_user(user=request.user, run_id=run_id)
        fired = services.run_alert_send(actor=request.user, run=run, **valid(RunAlertInputSerializer, request))
        return Response({"fired": len(fired)}, status=status.HTTP_201_CREATED)


class ProjectReliabilityApi(APIView):
    """``projects/{slug}/reliability/``: the lost-work ledger and the checkpoint interval it recommends."""

    @extend_schema(tags=TAGS, parameters=[_SLUG], responses={200: OpenApiResponse(description="docs/api.md")})
    def get(self, request, slug):
        """GPU-hours lost per failed, crashed or preempted Run, failures per week, MTBF per queue, checkpoint
        stall and interval per Code and the Young/Daly interval (any member or viewer)."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        return Response(reliability_json(project_reliability(project=project)))
