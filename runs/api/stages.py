"""``runs/{id}/data-stages/``: record a data stage, read the history or the composition at a step
(docs/design/runs.md#data-stages, #data-stages-sdk).

Thin (docs/design/house.md#views): the Run is fetched through ``run_get_for_user`` (another
Project's Run → 404), the one service ``data_stage_record`` checks the role
(viewer → 403) and every rule (400 naming the field, 409 with the reason).
Stages are append-only: there is no PUT, PATCH or DELETE.
"""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from mado.api import request_int, valid
from runs import selectors, services
from runs.api.serializers import FENCING_PARAMETER
from runs.lease import fencing_token

TAGS = ["data stages"]
_RUN_ID = OpenApiParameter("run_id", int, OpenApiParameter.PATH, description="run id")


class DataStageVersionOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    dataset_id = serializers.IntegerField(read_only=True)
    dataset = serializers.CharField(source="dataset.name", read_only=True, help_text="dataset name")
    version = serializers.CharField(read_only=True)


class DataStageInputSerializer(serializers.Serializer):
    start_step = serializers.IntegerField(help_text="the first step trained on this set (>= 0, after the last stage's)")
    input_dataset_version_ids = serializers.ListField(
        child=serializers.IntegerField(),
        allow_empty=True,
        help_text="the FULL set of dataset versions from start_step on (not a delta)",
    )
    checkpoint_id = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="a checkpoint of this Run at a step <= start_step"
    )
    metadata = serializers.JSONField(required=False, default=dict, help_text='a JSON object, e.g. {"note": "…"}')


class DataStageOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="stage.id", read_only=True)
    run_id = serializers.IntegerField(source="stage.run_id", read_only=True)
    start_step = serializers.IntegerField(source="stage.start_step", read_only=True)
    dataset_version_ids = serializers.SerializerMethodField(help_text="the full set from start_step on")
    dataset_versions = DataStageVersionOutputSerializer(source="versions", many=True, read_only=True)
    added = DataStageVersionOutputSerializer(many=True, read_only=True, help_text="compared with the set before")
    removed = DataStageVersionOutputSerializer(many=True, read_only=True, help_text="compared with the set before")
    checkpoint_id = serializers.IntegerField(source="stage.checkpoint_id", read_only=True, allow_null=True)
    metadata = serializers.JSONField(source="stage.metadata", read_only=True)
    created_by = serializers.CharField(source="stage.created_by.username", read_only=True, help_text="username")
    created_at = serializers.DateTimeField(source="stage.created_at", read_only=True)

    def get_dataset_version_ids(self, entry) -> list[int]:
        return sorted(v.pk for v in entry["versions"])


class DataStageHistoryOutputSerializer(serializers.Serializer):
    run_id = serializers.IntegerField()
    initial_dataset_versions = DataStageVersionOutputSerializer(many=True, help_text="the Run's initial inputs")
    results = DataStageOutputSerializer(many=True, help_text="stages by start_step")


class DataCompositionOutputSerializer(serializers.Serializer):
    run_id = serializers.IntegerField()
    step = serializers.IntegerField()
    dataset_version_ids = serializers.ListField(child=serializers.IntegerField())
    dataset_versions = DataStageVersionOutputSerializer(many=True, help_text="the set in force at step")


_GET_OUTPUT = PolymorphicProxySerializer(
    component_name="DataStageGetOutput",
    serializers=[DataStageHistoryOutputSerializer, DataCompositionOutputSerializer],
    resource_type_field_name=None,
)


class RunDataStagesApi(APIView):
    """``runs/{id}/data-stages/``: the Run's training data history; POST records a stage."""

    @extend_schema(
        tags=TAGS,
        parameters=[_RUN_ID, OpenApiParameter("at_step", int, description="the composition at this step")],
        responses={200: _GET_OUTPUT, 404: OpenApiResponse(description="run not visible")},
    )
    def get(self, request, run_id):
        """``{run_id, initial_dataset_versions, results: [stage…]}``; with ``?at_step=N``:
        ``{run_id, step, dataset_version_ids, dataset_versions}``, the set in force at step N."""
        run = selectors.run_get_for_user(user=request.user, run_id=run_id)
        step = request_int(request.query_params.get("at_step"), "at_step")
        if step is not None:
            versions = selectors.data_composition_at(run=run, step=step)
            body = {
                "run_id": run.pk,
                "step": step,
                "dataset_version_ids": sorted(v.pk for v in versions),
                "dataset_versions": versions,
            }
            return Response(DataCompositionOutputSerializer(body).data)
        body = {
            "run_id": run.pk,
            "initial_dataset_versions": selectors.run_input_dataset_versions(run=run),
            "results": selectors.data_stage_history(run=run),
        }
        return Response(DataStageHistoryOutputSerializer(body).data)

    @extend_schema(
        tags=TAGS,
        parameters=[_RUN_ID, FENCING_PARAMETER],
        request=DataStageInputSerializer,
        responses={
            201: DataStageOutputSerializer,
            200: OpenApiResponse(DataStageOutputSerializer, description="identical content already recorded"),
            400: OpenApiResponse(description="bad field (named): empty set, unknown ids (listed), step, checkpoint"),
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="run not visible"),
            409: OpenApiResponse(
                description="another set is recorded at start_step (body: recorded), "
                "the Job has ended, or lease_lost (stale fencing token)"
            ),
        },
    )
    def post(self, request, run_id):
        """Record ``{start_step, input_dataset_version_ids, checkpoint_id?, metadata?}``: 201 the stage.

        The same content again → 200 the same stage (a retry is safe).
        """
        run = selectors.run_get_for_user(user=request.user, run_id=run_id)
        data = valid(DataStageInputSerializer, request)
        stage, created = services.data_stage_record(
            actor=request.user,
            run=run,
            start_step=data["start_step"],
            dataset_version_ids=data["input_dataset_version_ids"],
            checkpoint_id=data["checkpoint_id"],
            metadata=data["metadata"],
            fencing_token=fencing_token(request),
        )
        entry = next(e for e in selectors.data_stage_history(run=run) if e["stage"].pk == stage.pk)
        return Response(
            DataStageOutputSerializer(entry).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )
