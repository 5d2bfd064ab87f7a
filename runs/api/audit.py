"""``audit/``: the audit log through the API (docs/api.md#audit), as JSON pages or CSV."""

from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers

from mado.api import PaginatedListApi
from mado.models import AuditEvent
from runs import selectors
from runs.audit import audit_csv_lines, audit_list


class AuditEventOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor_kind",
            "actor_id",
            "actor_name",
            "via",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "project_id",
            "changes",
            "address",
            "request_id",
        ]


class AuditFilterInputSerializer(serializers.Serializer):
    project = serializers.SlugField(required=False)
    action = serializers.CharField(required=False, max_length=64, default="")
    actor = serializers.CharField(required=False, max_length=150, default="")
    since = serializers.DateTimeField(required=False, default=None)
    until = serializers.DateTimeField(required=False, default=None)
    export = serializers.ChoiceField(choices=["json", "csv"], required=False, default="json")


class AuditListApi(PaginatedListApi):
    """``audit/``: records of the Projects the user administers (a superuser: all), newest first."""

    run_token_allowed = False

    @extend_schema(
        tags=["audit"],
        parameters=[AuditFilterInputSerializer],
        responses=AuditEventOutputSerializer(many=True),
    )
    def get(self, request):
        """Filter by ``project`` (slug), ``action`` (prefix, e.g. ``run.``), ``actor`` (username), ``since`` /
        ``until`` (ISO 8601 times); ``export=csv`` answers every matching record as CSV instead of a JSON page.
        A Project the user is not a member of is 404; one they do not administer gives no records."""
        filters = AuditFilterInputSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        data = dict(filters.validated_data)
        slug, kind = data.pop("project", None), data.pop("export")
        project = selectors.project_get_for_user(user=request.user, slug=slug) if slug else None
        events = audit_list(user=request.user, project=project, **data)
        if kind == "csv":
            response = StreamingHttpResponse(audit_csv_lines(events), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = 'attachment; filename="audit.csv"'
            return response
        return self.paginated(events, AuditEventOutputSerializer)
