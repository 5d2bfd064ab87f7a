"""Input and output serializers of the runs API (docs/api.md). Names are globally unique for the schema."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.urls import NoReverseMatch, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_field
from rest_framework import serializers

from mado import policy
from runs.lease import FENCING_HEADER
from runs.models import Role, RunKind, RunStatus
from runs.resume import RESUME_ERROR, RESUME_MODES, RUN_ID_ERROR, RUN_ID_PATTERN

# --- projects and members ---------------------------------------------------------


class ProjectInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    slug = serializers.CharField(max_length=100, required=False, allow_blank=True, help_text="default: slugified name")


class ProjectOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    slug = serializers.CharField(read_only=True)
    role = serializers.SerializerMethodField(help_text="the requesting user's role in the project")
    created_at = serializers.DateTimeField(read_only=True)

    def get_role(self, project) -> str | None:
        role = getattr(project, "role", None)
        return role or policy.role_in(self.context["request"].user, project)


class MembershipInputSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipRoleInputSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipOutputSerializer(serializers.Serializer):
    username = serializers.CharField(source="user.username", read_only=True)
    role = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)


# --- datasets and codes -----------------------------------------------------------


class NamedInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)


class DatasetOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)


class DatasetVersionInputSerializer(serializers.Serializer):
    version = serializers.CharField(max_length=100)
    uri = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    description = serializers.CharField(required=False, allow_blank=True, default="")


class DatasetVersionOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    dataset_id = serializers.IntegerField(read_only=True)
    version = serializers.CharField(read_only=True)
    uri = serializers.CharField(read_only=True)
    description = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)


class CodeOutputSerializer(DatasetOutputSerializer):
    pass


@extend_schema_field(OpenApiTypes.STR)
class EntrypointField(serializers.Field):
    """argv as a JSON list of strings, sent as a string in multipart (``'["python", "train.py"]'``) or a list in
    JSON."""

    default_error_messages = {
        "invalid": 'entrypoint must be a JSON list of non-empty strings, e.g. ["python", "train.py"]'
    }

    def to_internal_value(self, data):
        import json

        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                self.fail("invalid")
        if not isinstance(data, list) or not data or not all(isinstance(arg, str) and arg for arg in data):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class CodeVersionInputSerializer(serializers.Serializer):
    entrypoint = EntrypointField(help_text='argv as a JSON list string, e.g. ["python", "train.py"]')
    archive = serializers.FileField(required=False, help_text="source archive (tar or zip), streamed to storage")


class CodeVersionOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    code_id = serializers.IntegerField(read_only=True)
    version = serializers.IntegerField(read_only=True)
    entrypoint = serializers.ListField(child=serializers.CharField(), read_only=True)
    archive_sha256 = serializers.CharField(source="archive.sha256", read_only=True, allow_null=True, default=None)
    archive_size = serializers.IntegerField(
        source="archive.size", read_only=True, allow_null=True, default=None, help_text="bytes"
    )
    created_at = serializers.DateTimeField(read_only=True)


# --- runs -------------------------------------------------------------------------


class RunInputSerializer(serializers.Serializer):
    project = serializers.SlugField(max_length=100, help_text="project slug")
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(choices=RunKind.choices, required=False, default=RunKind.TRAINING)
    parameters = serializers.JSONField(required=False, default=dict, help_text="a JSON object")
    input_dataset_version_ids = serializers.ListField(child=serializers.IntegerField(), required=False, default=list)
    code_version_id = serializers.IntegerField(required=False, allow_null=True, default=None)
    parent_id = serializers.IntegerField(required=False, allow_null=True, default=None)
    external_id = serializers.CharField(
        max_length=128,
        required=False,
        allow_blank=True,
        allow_null=True,
        default=None,
        validators=[RegexValidator(RUN_ID_PATTERN, RUN_ID_ERROR)],
        error_messages={"max_length": RUN_ID_ERROR},
        help_text="run id, unique per project: 1 to 128 characters from [A-Za-z0-9_.-]",
    )
    resume = serializers.ChoiceField(
        choices=RESUME_MODES,
        required=False,
        allow_null=True,
        default=None,
        error_messages={"invalid_choice": RESUME_ERROR},
        help_text="must: resume external_id or 404; allow: resume it or create it; never (or absent): 409 if it exists",
    )
    allow_param_change = serializers.BooleanField(
        required=False, default=False, help_text="on a resume, let parameters change value (each change is recorded)"
    )
    host = serializers.CharField(
        max_length=255, required=False, allow_blank=True, default="", help_text="writer host name"
    )
    pid = serializers.IntegerField(
        min_value=0, required=False, allow_null=True, default=None, help_text="writer process id"
    )


FENCING_PARAMETER = OpenApiParameter(
    FENCING_HEADER,
    OpenApiTypes.INT,
    OpenApiParameter.HEADER,
    description="the run's fencing_token from POST runs/: a stale one answers 409 lease_lost, nothing stored",
)


class RunStatusInputSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=RunStatus.choices)


def run_page_url(request, run) -> str:
    """Absolute URL of the Run's page (``runs:run-detail``), ``/runs/<id>/`` until the pages exist."""
    try:
        path = reverse("runs:run-detail", args=[run.pk])
    except NoReverseMatch:
        path = f"/runs/{run.pk}/"
    return request.build_absolute_uri(path) if request is not None else path


class RunOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    external_id = serializers.CharField(read_only=True)
    project = serializers.CharField(source="project.slug", read_only=True, help_text="project slug")
    name = serializers.CharField(read_only=True)
    kind = serializers.ChoiceField(choices=RunKind.choices, read_only=True)
    status = serializers.ChoiceField(choices=RunStatus.choices, read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, help_text="username")
    parameters = serializers.JSONField(read_only=True)
    input_dataset_version_ids = serializers.SerializerMethodField()
    code_version_id = serializers.IntegerField(read_only=True, allow_null=True)
    parent_id = serializers.IntegerField(read_only=True, allow_null=True)
    source_checkpoint_id = serializers.IntegerField(read_only=True, allow_null=True)
    heartbeat_at = serializers.DateTimeField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)
    started_at = serializers.DateTimeField(read_only=True, allow_null=True)
    ended_at = serializers.DateTimeField(read_only=True, allow_null=True)
    ended_reason = serializers.CharField(
        read_only=True, help_text="why the server ended the Run (crashed: the silence)"
    )
    last_write_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="last write of a Run that sends no heartbeats"
    )
    url = serializers.SerializerMethodField(help_text="absolute URL of the Run page")
    fencing_token = serializers.IntegerField(
        source="lease_token", read_only=True, help_text="send it as the Mado-Fencing-Token header with every write"
    )
    resumed = serializers.SerializerMethodField(help_text="true when this POST runs/ resumed a stopped run")
    resume_count = serializers.IntegerField(read_only=True)
    last_step = serializers.SerializerMethodField(help_text="highest step reached before this resume; null otherwise")
    step_floor = serializers.IntegerField(
        read_only=True, help_text="metric points at a lower step are not added to the series: they are compared"
    )
    dropped_points = serializers.IntegerField(read_only=True, help_text="points dropped below step_floor so far")
    writer_host = serializers.CharField(read_only=True)
    writer_pid = serializers.IntegerField(read_only=True, allow_null=True)
    writer_since = serializers.DateTimeField(read_only=True, allow_null=True)
    heartbeat_interval = serializers.SerializerMethodField(help_text="seconds between the SDK's heartbeats")
    crash_timeout = serializers.SerializerMethodField(
        help_text="seconds without a heartbeat after which a running Run is marked crashed"
    )

    def get_input_dataset_version_ids(self, run) -> list[int]:
        return sorted(version.pk for version in run.input_dataset_versions.all())

    def get_url(self, run) -> str:
        return run_page_url(self.context.get("request"), run)

    def get_resumed(self, run) -> bool:
        return bool(self.context.get("resumed", False))

    def get_last_step(self, run) -> int | None:
        return self.context.get("last_step")

    def get_heartbeat_interval(self, run) -> int:
        return settings.MMT_HEARTBEAT_INTERVAL

    def get_crash_timeout(self, run) -> int:
        return settings.MMT_CRASH_TIMEOUT


# --- metrics (documentation only: the hot path parses and renders plain JSON) -----


@extend_schema_field({"oneOf": [{"type": "number"}, {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}]})
class MetricValueField(serializers.FloatField):
    pass


class MetricPointInputSerializer(serializers.Serializer):
    key = serializers.CharField(max_length=250)
    value = MetricValueField()
    step = serializers.IntegerField(min_value=0)
    timestamp = serializers.FloatField(required=False, help_text="Unix seconds; default: time of receipt")


class MetricBatchInputSerializer(serializers.Serializer):
    points = MetricPointInputSerializer(many=True, help_text="at most 10,000 points; all stored or none")


class MetricBatchOutputSerializer(serializers.Serializer):
    stored = serializers.IntegerField()
    compared = serializers.IntegerField(
        help_text="points below the run's step_floor after a resume: kept as the resumed segment's own record and "
        "compared with the run's series, which keeps the first values"
    )
    dropped = serializers.IntegerField(help_text="points not stored: their step was below the run's step_floor")
    dropped_keys = serializers.ListField(child=serializers.CharField(), help_text="the dropped points' keys, sorted")


class MetricKeysOutputSerializer(serializers.Serializer):
    keys = serializers.ListField(child=serializers.CharField())


class MetricPointOutputSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    value = MetricValueField()
    timestamp = serializers.FloatField(help_text="Unix seconds")


class MetricHistoryOutputSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = MetricPointOutputSerializer(many=True)
