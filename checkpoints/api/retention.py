"""Storage usage, retention policies and bulk deletion of a Project's checkpoints
(docs/design/checkpoints.md#usage, #retention, #deletion; docs/api.md)."""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from checkpoints.models import RetentionPolicy
from checkpoints.retention import Rules, plan_json, retention_plan
from checkpoints.services import retention as services
from checkpoints.usage import project_usage, run_usage
from mado import policy
from mado.api import valid
from runs import selectors as run_selectors

TAGS = ["storage"]
_SLUG = OpenApiParameter("slug", str, OpenApiParameter.PATH, description="project slug")
_ADMIN = OpenApiResponse(description="not a project admin")


class RetentionRulesSerializer(serializers.Serializer):
    keep_last = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    keep_best = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    best_metric = serializers.CharField(max_length=250, required=False, allow_blank=True, default="")
    best_mode = serializers.ChoiceField(choices=RetentionPolicy.BestMode.values, required=False, default="min")
    keep_every = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    keep_newer_days = serializers.IntegerField(min_value=0, required=False, allow_null=True, default=None)


class RetentionPolicyInputSerializer(RetentionRulesSerializer):
    scheduled = serializers.BooleanField(required=False, default=False)


class RetentionPolicyOutputSerializer(RetentionPolicyInputSerializer):
    last_applied_at = serializers.DateTimeField(allow_null=True)


class RetentionApplyInputSerializer(serializers.Serializer):
    plan = serializers.CharField(
        max_length=100_000, required=False, allow_blank=True, default="", help_text="the plan id of a preview"
    )


class BulkDeleteInputSerializer(serializers.Serializer):
    run_ids = serializers.ListField(child=serializers.IntegerField(min_value=1), min_length=1, max_length=1000)


def deleted_json(outcome) -> dict:
    """``{"deleted": [{id, run_id, step}], "refused": [{id, reason}], "bytes"}`` of a ``Deleted``; an applied
    plan's refused ones also say their ``run_id`` and ``step``."""
    refused = [{"id": pk, "reason": reason} for pk, reason in sorted(outcome.refused.items())]
    if isinstance(outcome, services.Applied):
        refused = [{"id": c.pk, "run_id": c.run_id, "step": c.step, "reason": why} for c, why in outcome.skipped]
    return {
        "deleted": [{"id": c.pk, "run_id": c.run_id, "step": c.step} for c in outcome.deleted],
        "refused": refused,
        "bytes": outcome.bytes,
    }


class ProjectUsageApi(APIView):
    """``projects/{slug}/usage/``: bytes the Project stores (any member or viewer)."""

    @extend_schema(tags=TAGS, parameters=[_SLUG], responses=OpenApiResponse(description="usage figures, bytes"))
    def get(self, request, slug):
        """``{bytes, files, by_kind, largest_runs, checkpoints_by_age, reclaimable, scrub}``, all sizes in bytes;
        ``scrub``: ``{last_full_scrub, verified, complete, corrupt}`` (when every complete checkpoint had last been
        read back and matched, null until each has been; counts of checkpoints)."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        return Response(project_usage(project=project))


class RunUsageApi(APIView):
    """``runs/{run_id}/usage/``: bytes one Run stores, by kind (any member or viewer, the Run's own token)."""

    @extend_schema(tags=TAGS, responses=OpenApiResponse(description="{bytes, files, by_kind}, bytes"))
    def get(self, request, run_id):
        """``{bytes, files, by_kind: {kind: {bytes, files}}}``."""
        run = run_selectors.run_get_for_user(user=request.user, run_id=run_id)
        return Response(run_usage(run=run))


class RetentionPolicyApi(APIView):
    """``projects/{slug}/retention-policy/``: the Project's retention rules; any member reads, admins set."""

    @extend_schema(tags=TAGS, parameters=[_SLUG], responses=RetentionPolicyOutputSerializer)
    def get(self, request, slug):
        """The saved policy, or 404 when the Project has none (nothing is deleted then)."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        saved = RetentionPolicy.objects.filter(project=project).first()
        if saved is None:
            return Response({"error": "not_found", "detail": "no retention policy", "field": None}, status=404)
        return Response(RetentionPolicyOutputSerializer(saved).data)

    @extend_schema(
        tags=TAGS,
        parameters=[_SLUG],
        request=RetentionPolicyInputSerializer,
        responses={200: RetentionPolicyOutputSerializer, 400: OpenApiResponse(description="no rule"), 403: _ADMIN},
    )
    def put(self, request, slug):
        """Save the rules (at least one) and ``scheduled``; deletes nothing. Admins only."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        policy.require_role(request.user, project, policy.ADMIN)
        data = valid(RetentionPolicyInputSerializer, request)
        scheduled = data.pop("scheduled")
        saved = services.retention_policy_set(
            actor=request.user, project=project, rules=Rules(**data), scheduled=scheduled
        )
        return Response(RetentionPolicyOutputSerializer(saved).data)


class RetentionPreviewApi(APIView):
    """``projects/{slug}/retention-policy/preview/``: what the rules sent (or the saved policy) would delete."""

    @extend_schema(
        tags=TAGS,
        parameters=[_SLUG],
        request=RetentionRulesSerializer,
        responses={
            200: OpenApiResponse(description="{plan, runs: [{run_id, name, bytes, going, protected}], bytes}"),
            403: _ADMIN,
        },
    )
    def post(self, request, slug):
        """The preview of the rules in the body; an empty body previews the saved policy. Admins only."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        policy.require_role(request.user, project, policy.ADMIN)
        saved = RetentionPolicy.objects.filter(project=project).first()
        if request.data or saved is None:
            rules = services.clean_rules(Rules(**valid(RetentionRulesSerializer, request)))
        else:
            rules = Rules.of(saved)
        return Response(plan_json(project=project, plans=retention_plan(project=project, rules=rules)))


class RetentionApplyApi(APIView):
    """``projects/{slug}/retention-policy/apply/``: delete exactly what a preview of the saved policy listed."""

    @extend_schema(
        tags=TAGS,
        parameters=[_SLUG],
        request=RetentionApplyInputSerializer,
        responses={
            200: OpenApiResponse(description="{deleted, refused: [{id, run_id, step, reason}], bytes}"),
            400: OpenApiResponse(description="no policy, or no valid plan"),
            403: _ADMIN,
            409: OpenApiResponse(description="the plan changed: nothing deleted; the fresh preview in plan"),
        },
    )
    def post(self, request, slug):
        """Apply the preview ``{plan}``; what became protected since stays (in ``refused`` with the reason). Admins
        only. 409 ``plan_changed`` with the fresh preview when applying now would delete more than the plan."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        plan = valid(RetentionApplyInputSerializer, request)["plan"]
        return Response(deleted_json(services.retention_apply(actor=request.user, project=project, plan=plan)))


class CheckpointBulkDeleteApi(APIView):
    """``projects/{slug}/checkpoints/bulk-delete/``: delete every unprotected checkpoint of the Runs sent."""

    @extend_schema(
        tags=TAGS,
        parameters=[_SLUG],
        request=BulkDeleteInputSerializer,
        responses={200: OpenApiResponse(description="{deleted, refused, bytes}"), 403: _ADMIN},
    )
    def post(self, request, slug):
        """``{run_ids}`` (at most 1000); protected checkpoints are listed in ``refused``. Admins only."""
        project = run_selectors.project_get_for_user(user=request.user, slug=slug)
        run_ids = valid(BulkDeleteInputSerializer, request)["run_ids"]
        return Response(
            deleted_json(services.runs_checkpoints_delete(actor=request.user, project=project, run_ids=run_ids))
        )
