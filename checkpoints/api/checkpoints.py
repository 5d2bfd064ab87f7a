"""API views for Checkpoints: register, upload, complete, list, read, download, delete (docs/api.md "Checkpoints").

Thin views (docs/design/house.md#views): authenticate, validate the input shape, fetch through a
selector, call one service, serialize. A Checkpoint in another Project
answers 404; a viewer's write 403; a member's delete 403
(docs/design/checkpoints.md#a-checkpoint, #keep-count, #deletion; docs/design/worker.md#fetch).
"""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from checkpoints import selectors, services, storage
from checkpoints.api.artifacts import LenientNegotiation, OctetStreamParser, ranged_download, upload_source
from checkpoints.models import CheckpointLayout, CheckpointState
from checkpoints.services import integrity
from mado.api import valid
from mado.errors import Conflict
from runs.api.serializers import FENCING_PARAMETER
from runs.lease import fencing_token
from runs.selectors import run_get_for_user

_RUN_ID = OpenApiParameter("run_id", int, OpenApiParameter.PATH, description="run id")
_CHECKPOINT_ID = OpenApiParameter("checkpoint_id", int, OpenApiParameter.PATH, description="checkpoint id")


class ManifestEntryOutputSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="relative POSIX path inside the checkpoint directory")
    size = serializers.IntegerField(help_text="bytes")
    sha256 = serializers.CharField(help_text="hex SHA-256 of the file")


class PartInputSerializer(serializers.Serializer):
    part_number = serializers.IntegerField(min_value=1)
    etag = serializers.CharField(help_text="the ETag the part's PUT answered")


@extend_schema_field(ManifestEntryOutputSerializer(many=True))
class ManifestListField(serializers.ListField):
    """Every file ``{path, size, sha256}``; entries are checked by the service in one plain loop (fast for 10^5
    files)."""

    def to_internal_value(self, data):
        if not isinstance(data, list):
            self.fail("not_a_list", input_type=type(data).__name__)
        return data


@extend_schema_field(PartInputSerializer(many=True))
class PartListField(ManifestListField):
    """``[{part_number, etag}]`` of a direct S3 upload, checked by the service."""


class CheckpointOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    run_id = serializers.IntegerField(read_only=True)
    step = serializers.IntegerField(read_only=True, help_text="steps completed when it was saved")
    framework = serializers.CharField(read_only=True)
    world_size = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="processes that wrote a torch-dcp checkpoint; null otherwise"
    )
    includes_optimizer = serializers.BooleanField(read_only=True)
    file_count = serializers.IntegerField(read_only=True)
    total_bytes = serializers.IntegerField(read_only=True, help_text="sum of the files' sizes, bytes")
    tar_size = serializers.IntegerField(read_only=True, allow_null=True, help_text="bytes; null until complete")
    tar_sha256 = serializers.CharField(read_only=True, help_text="empty until complete")
    artifact_path = serializers.CharField(read_only=True, help_text="checkpoints/step-<N>.tar")
    state = serializers.ChoiceField(choices=CheckpointState.choices, read_only=True)
    layout = serializers.ChoiceField(
        choices=CheckpointLayout.choices,
        read_only=True,
        help_text="tar: one tar (GET tar); files: one stored file per manifest entry, saved through MLflow "
        "(GET files/<path>)",
    )
    error = serializers.CharField(read_only=True, help_text="why the last upload or verification failed; empty if none")
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, help_text="username"
    )
    created_at = serializers.DateTimeField(read_only=True)
    completed_at = serializers.DateTimeField(read_only=True, allow_null=True)
    stored_bytes = serializers.IntegerField(
        read_only=True, help_text="bytes it holds in the storage: its tar, or its files when stored file by file"
    )
    verified_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="when a scrub last read the stored bytes back and they matched"
    )
    within_keep_count = serializers.BooleanField(read_only=True, help_text="among the Run's newest K complete ones")
    metadata = serializers.JSONField(
        read_only=True, help_text="what the saving code said about it: training_state, preemption {signal, signal_at}"
    )
    signal_to_complete_s = serializers.FloatField(
        read_only=True, allow_null=True, help_text="saved on a preemption signal: seconds from it to complete"
    )
    direct_upload = serializers.SerializerMethodField(help_text="true when upload-parts (presigned S3) is available")

    def get_direct_upload(self, obj) -> bool:
        return storage.s3_storage() is not None


class CheckpointDetailOutputSerializer(CheckpointOutputSerializer):
    manifest = serializers.SerializerMethodField()

    @extend_schema_field(ManifestEntryOutputSerializer(many=True))
    def get_manifest(self, obj) -> list[dict]:
        return list(selectors.checkpoint_manifest(checkpoint=obj).values("path", "size", "sha256"))


class CheckpointRegisterInputSerializer(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, help_text="steps completed (resume runs range(step, TOTAL))")
    framework = serializers.CharField(max_length=50, required=False, allow_blank=True, default="")
    includes_optimizer = serializers.BooleanField(required=False, default=False)
    world_size = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        default=None,
        help_text="framework torch-dcp only, and required there: the processes that wrote the shards",
    )
    metadata = serializers.JSONField(
        required=False,
        default=None,
        help_text="JSON object (at most 64 KiB): training_state, preemption {signal, signal_at unix seconds}, …",
    )


class CheckpointUploadOutputSerializer(serializers.Serializer):
    received_bytes = serializers.IntegerField(help_text="bytes stored")
    sha256 = serializers.CharField(help_text="hex SHA-256 of the tar as received")


class CheckpointUploadPartsInputSerializer(serializers.Serializer):
    tar_size = serializers.IntegerField(min_value=1, help_text="bytes")


class CheckpointUploadPartsOutputSerializer(serializers.Serializer):
    upload_id = serializers.CharField()
    part_size = serializers.IntegerField(help_text="bytes; the last part holds the rest")
    urls = serializers.ListField(child=serializers.URLField(), help_text="presigned PUT URL of part 1, 2, …")
    abort_url = serializers.URLField(help_text="presigned DELETE URL: a client that gives up aborts the upload")


class CheckpointCompleteInputSerializer(serializers.Serializer):
    tar_size = serializers.IntegerField(min_value=0, help_text="bytes")
    tar_sha256 = serializers.CharField(
        max_length=64,
        required=False,
        allow_null=True,
        help_text="hex SHA-256 of the whole tar, checked when sent; optional: the server computes and records it",
    )
    manifest = ManifestListField(required=False, help_text="every file; or send manifest_sha256 instead")
    manifest_sha256 = serializers.CharField(
        max_length=64,
        required=False,
        help_text="hex SHA-256 of the manifest's canonical JSON (sorted by path, keys sorted, no spaces): a large "
        "checkpoint's declaration without its file list",
    )
    upload_id = serializers.CharField(required=False, help_text="direct S3 upload only")
    parts = PartListField(required=False)


def _checkpoint_out(request, checkpoint_id, serializer=CheckpointOutputSerializer) -> dict:
    checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
    return serializer(checkpoint).data


class CheckpointListApi(GenericAPIView):
    """``runs/{id}/checkpoints/``: a Run's checkpoints; register a new one."""

    @extend_schema(
        tags=["checkpoints"],
        parameters=[_RUN_ID, OpenApiParameter("all", bool, description="1: include pending and deleted checkpoints")],
        responses=CheckpointOutputSerializer(many=True),
    )
    def get(self, request, run_id):
        """Complete checkpoints, newest step first, each with ``within_keep_count`` (paginated).

        ``?all=1`` adds pending and deleted ones. Older checkpoints beyond the
        keep count are listed too (flagged ``false``): they stay usable.
        """
        run = run_get_for_user(user=request.user, run_id=run_id)
        include_unusable = request.query_params.get("all", "").lower() in ("1", "true", "yes")
        checkpoints, _ = selectors.checkpoint_list_for_run(
            run=run, include_older=True, include_unusable=include_unusable
        )
        page = self.paginate_queryset(checkpoints)
        return self.get_paginated_response(CheckpointOutputSerializer(page, many=True).data)

    @extend_schema(
        tags=["checkpoints"],
        parameters=[
            _RUN_ID,
            OpenApiParameter(
                "Idempotency-Key", str, OpenApiParameter.HEADER, description="one per log_checkpoint call"
            ),
            FENCING_PARAMETER,
        ],
        request=CheckpointRegisterInputSerializer,
        responses={
            201: CheckpointOutputSerializer,
            200: CheckpointOutputSerializer,
            400: OpenApiResponse(description="negative or missing step"),
            403: OpenApiResponse(description="viewer"),
            409: OpenApiResponse(description="step N is already saved in this run; lease_lost (stale fencing token)"),
        },
    )
    def post(self, request, run_id):
        """Register a pending checkpoint at ``step`` (member or admin).

        201 new; 200 the same checkpoint again for the same ``Idempotency-Key``;
        409 ``step N is already saved in this run`` otherwise, except a pending
        one of a writer that was taken over (older fencing token): it is
        discarded and the step registered anew.
        """
        run = run_get_for_user(user=request.user, run_id=run_id)
        data = valid(CheckpointRegisterInputSerializer, request)
        checkpoint, created = services.checkpoint_register(
            actor=request.user,
            run=run,
            idempotency_key=request.headers.get("Idempotency-Key"),
            fencing_token=fencing_token(request),
            **data,
        )
        return Response(
            _checkpoint_out(request, checkpoint.pk), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class CheckpointDetailApi(APIView):
    """``checkpoints/{id}/``: one checkpoint with its manifest; delete."""

    @extend_schema(tags=["checkpoints"], parameters=[_CHECKPOINT_ID], responses=CheckpointDetailOutputSerializer)
    def get(self, request, checkpoint_id):
        """The checkpoint in any state, with ``manifest`` (empty until complete) and ``within_keep_count``."""
        return Response(_checkpoint_out(request, checkpoint_id, CheckpointDetailOutputSerializer))

    @extend_schema(
        tags=["checkpoints"],
        parameters=[_CHECKPOINT_ID],
        responses={
            204: None,
            403: OpenApiResponse(description="not a project admin"),
            409: OpenApiResponse(description="inside the keep count, or the source checkpoint of a Run"),
        },
    )
    def delete(self, request, checkpoint_id):
        """Delete (Project admin only): the row stays ``deleted``, its stored tar goes.

        409 with the reason when the checkpoint is one of the Run's newest
        ``MMT_CHECKPOINT_KEEP_COUNT`` complete ones or any Run's source checkpoint.
        """
        checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        services.checkpoint_delete(actor=request.user, checkpoint=checkpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CheckpointTarApi(APIView):
    """``checkpoints/{id}/tar``: upload (streamed, verified) and ranged download of the tar."""

    parser_classes = [OctetStreamParser]
    content_negotiation_class = LenientNegotiation

    @extend_schema(
        tags=["checkpoints"],
        parameters=[_CHECKPOINT_ID, FENCING_PARAMETER],
        request={"application/x-tar": OpenApiTypes.BINARY},
        responses={
            200: CheckpointUploadOutputSerializer,
            400: OpenApiResponse(description="Checkpoint <id> <what> mismatch: … (not a tar, link, '..', cut off)"),
            403: OpenApiResponse(description="viewer"),
            409: OpenApiResponse(description="the checkpoint is complete or deleted; lease_lost"),
        },
    )
    def put(self, request, checkpoint_id):
        """Stream the raw tar (send ``Content-Length``); it is parsed and hashed as it arrives.

        A retry replaces a previous pending upload; a failed one keeps nothing.
        """
        checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        source, length = upload_source(request)
        received = services.checkpoint_upload(
            actor=request.user,
            checkpoint=checkpoint,
            source=source,
            expected_size=length,
            fencing_token=fencing_token(request),
        )
        return Response(CheckpointUploadOutputSerializer(received).data)

    @extend_schema(
        tags=["checkpoints"],
        parameters=[
            _CHECKPOINT_ID,
            OpenApiParameter("Range", str, OpenApiParameter.HEADER, description="bytes=a-b, bytes=a- or bytes=-n"),
        ],
        responses={
            (200, "application/x-tar"): OpenApiTypes.BINARY,
            (206, "application/x-tar"): OpenApiTypes.BINARY,
            409: OpenApiResponse(
                description="not complete (pending or deleted), or made of separate files (GET files/<path>)"
            ),
            410: OpenApiResponse(description="checkpoint_corrupt: the stored tar is missing or differs"),
            416: OpenApiResponse(description="range selects no byte"),
        },
    )
    def get(self, request, checkpoint_id):
        """The tar of a complete checkpoint, streamed; ``Range`` resumes a broken download (206).

        A checkpoint saved through MLflow has no tar (``layout: "files"``): 409 saying to download its files
        with ``GET checkpoints/{id}/files/<path>``.
        """
        checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        integrity.checkpoint_refuse_corrupt(checkpoint)
        refusal = selectors.checkpoint_download_refusal(checkpoint=checkpoint, layout=CheckpointLayout.TAR)
        if refusal is None and checkpoint.artifact is None:
            refusal = f"checkpoint {checkpoint.pk} has no stored tar"
        if refusal is not None:
            raise Conflict(refusal, field="checkpoint")
        return ranged_download(request, checkpoint.artifact)


class CheckpointUploadPartsApi(APIView):
    """``checkpoints/{id}/upload-parts/``: presigned multipart upload straight to S3."""

    @extend_schema(
        tags=["checkpoints"],
        parameters=[_CHECKPOINT_ID, FENCING_PARAMETER],
        request=CheckpointUploadPartsInputSerializer,
        responses={
            200: CheckpointUploadPartsOutputSerializer,
            409: OpenApiResponse(description="not S3 storage (PUT the tar instead), or not pending; lease_lost"),
        },
    )
    def post(self, request, checkpoint_id):
        """Start a direct upload of ``tar_size`` bytes: ``{upload_id, part_size, urls}`` (member or admin)."""
        checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        data = valid(CheckpointUploadPartsInputSerializer, request)
        result = services.checkpoint_upload_parts(
            actor=request.user, checkpoint=checkpoint, tar_size=data["tar_size"], fencing_token=fencing_token(request)
        )
        return Response(CheckpointUploadPartsOutputSerializer(result).data)


class CheckpointCompleteApi(APIView):
    """``checkpoints/{id}/complete/``: compare the declaration with the stored tar and complete."""

    @extend_schema(
        tags=["checkpoints"],
        parameters=[_CHECKPOINT_ID, FENCING_PARAMETER],
        request=CheckpointCompleteInputSerializer,
        responses={
            200: CheckpointOutputSerializer,
            202: OpenApiResponse(CheckpointOutputSerializer, description="direct S3 upload: verification queued"),
            400: OpenApiResponse(description="Checkpoint <id> <what> mismatch: … (stays pending)"),
            409: OpenApiResponse(
                description="no uploaded tar, deleted, or complete with another declaration; lease_lost"
            ),
        },
    )
    def post(self, request, checkpoint_id):
        """200 ``complete`` when size, SHA-256 (when sent) and members match exactly (same declaration again: 200).

        The members are declared as ``manifest`` (every file) or, so the body
        stays small for 10^5 files, as ``manifest_sha256`` (docs/api.md).

        With ``upload_id`` + ``parts`` (direct S3 upload) the multipart upload is
        completed and verified by a task: 202 while ``pending``, poll
        ``checkpoints/{id}/`` for ``state`` or ``error``.
        """
        checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        data = valid(CheckpointCompleteInputSerializer, request)
        checkpoint = services.checkpoint_complete(
            actor=request.user, checkpoint=checkpoint, fencing_token=fencing_token(request), **data
        )
        body = _checkpoint_out(request, checkpoint.pk)
        done = body["state"] == CheckpointState.COMPLETE
        return Response(body, status=status.HTTP_200_OK if done else status.HTTP_202_ACCEPTED)
