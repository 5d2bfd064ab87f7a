"""API views for a Run's artifacts: streamed PUT, ranged GET, DELETE, list (docs/api.md;
docs/design/checkpoints.md#a-checkpoint, #deletion; docs/design/worker.md#fetch).

Bodies never pass through memory whole: PUT reads the WSGI input in 1 MiB
chunks (never ``request.body``) and GET answers a ``StreamingHttpResponse``
over the storage (a ranged S3 GET or a seek in the file).
"""

import io
import re

from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotAcceptable
from rest_framework.generics import GenericAPIView
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from checkpoints import selectors, services
from checkpoints.services import integrity
from mado.api import request_int
from mado.errors import ValidationFailed
from runs.api.serializers import FENCING_PARAMETER
from runs.lease import fencing_token
from runs.selectors import run_get_for_user

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class ArtifactOutputSerializer(serializers.Serializer):
    path = serializers.CharField(read_only=True)
    size = serializers.IntegerField(read_only=True, help_text="bytes")
    sha256 = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)


class OctetStreamParser(BaseParser):
    """Declares the raw body for the schema; the view streams ``request.stream`` itself and never parses."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):  # pragma: no cover - never called
        raise NotImplementedError("artifact bodies are streamed by the view")


class LenientNegotiation(DefaultContentNegotiation):
    """A download client may ``Accept: application/octet-stream``; errors still render as JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            return renderers[0], renderers[0].media_type


class RangeNotSatisfiable(Exception):
    pass


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(first, last)`` inclusive byte offsets for a single ``bytes=`` range, None to send everything.

    Supports ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (RFC 9110). A
    malformed or multi-range header is ignored (None, as RFC 9110 allows);
    a range that selects no byte raises ``RangeNotSatisfiable``.
    """
    match = _RANGE.match((header or "").strip())
    if not match or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable
        return max(size - suffix, 0), size - 1
    first = int(first)
    if last != "" and int(last) < first:
        return None
    if first >= size:
        raise RangeNotSatisfiable
    last = size - 1 if last == "" else int(last)
    return first, min(last, size - 1)


def upload_source(request) -> tuple[object, int | None]:
    """The request body as a stream with its declared length (bytes), never read into memory.

    Without Content-Length, a chunked body is read to its end when the WSGI
    server terminates the input (gunicorn does); anything else has no body
    (HTTP/1.1: no length and no transfer coding means an empty body).
    """
    length = request_int(request.META.get("CONTENT_LENGTH"), "Content-Length")
    if length is not None:
        return (request.stream or io.BytesIO(b"")), length
    if request.META.get("wsgi.input_terminated"):
        return request.META["wsgi.input"], None
    if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
        raise ValidationFailed("send Content-Length: this server cannot read a chunked upload", field="Content-Length")
    return io.BytesIO(b""), 0


def ranged_download(request, artifact) -> StreamingHttpResponse | Response:
    """Stream ``artifact``'s bytes honouring ``Range`` / ``If-Range`` (RFC 9110).

    200 with everything, 206 with ``Content-Range`` for one satisfiable range,
    416 with ``Content-Range: bytes */size`` otherwise. ``ETag`` and
    ``X-Mado-Sha256`` carry the SHA-256. Shared by artifact and checkpoint
    tar downloads. A stored object missing or differing from its record answers 410 ``checkpoint_corrupt`` (its
    checkpoint turned corrupt) or ``artifact_damaged`` before any byte is sent (docs/design/checkpoints.md#damage).
    """
    etag = f'"{artifact.sha256}"'
    header = request.META.get("HTTP_RANGE")
    if request.META.get("HTTP_IF_RANGE", etag) != etag:
        header = None
    try:
        byte_range = parse_range(header, artifact.size)
        integrity.artifact_check_stored(artifact, from_first_byte=byte_range is None or byte_range[0] == 0)
    except RangeNotSatisfiable:
        return Response(
            {"error": "range_not_satisfiable", "detail": f"the file has {artifact.size} bytes", "field": "Range"},
            status=status.HTTP_416_REQUESTED_RANGE_NOT_SATISFIABLE,
            headers={"Content-Range": f"bytes */{artifact.size}"},
        )
    first, last = byte_range or (0, artifact.size - 1)
    response = StreamingHttpResponse(
        selectors.artifact_open_range(artifact=artifact, start=first, end=last),
        status=status.HTTP_206_PARTIAL_CONTENT if byte_range else status.HTTP_200_OK,
        content_type="application/octet-stream",
    )
    response["Content-Length"] = str(max(last - first + 1, 0))
    if byte_range:
        response["Content-Range"] = f"bytes {first}-{last}/{artifact.size}"
    response["Accept-Ranges"] = "bytes"
    response["ETag"] = etag
    response["X-Mado-Sha256"] = artifact.sha256
    response["Content-Disposition"] = content_disposition_header(True, artifact.path.rsplit("/", 1)[-1])
    return response


class ArtifactListApi(GenericAPIView):
    """``runs/{id}/artifacts/``."""

    @extend_schema(tags=["artifacts"], responses=ArtifactOutputSerializer(many=True))
    def get(self, request, run_id):
        """The Run's stored files ``{path, size, sha256, created_at}`` by path (paginated); 404 for another Project's
        Run."""
        run = run_get_for_user(user=request.user, run_id=run_id)
        page = self.paginate_queryset(selectors.artifact_list(run=run))
        return self.get_paginated_response(ArtifactOutputSerializer(page, many=True).data)


_PATH_DOC = "artifact path inside the Run, e.g. checkpoints/step-10.tar"


class ArtifactDetailApi(APIView):
    """``runs/{id}/artifacts/{path}``: one stored file of a Run."""

    parser_classes = [OctetStreamParser]
    content_negotiation_class = LenientNegotiation

    @extend_schema(
        tags=["artifacts"],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter("path", str, OpenApiParameter.PATH, description=_PATH_DOC),
            OpenApiParameter(
                "X-Mado-Sha256", str, OpenApiParameter.HEADER, description="expected SHA-256 (hex) of the body"
            ),
            FENCING_PARAMETER,
        ],
        responses={
            201: ArtifactOutputSerializer,
            200: ArtifactOutputSerializer,
            400: OpenApiResponse(description="unsafe path, digest mismatch or cut upload"),
            403: OpenApiResponse(description="viewer"),
            409: OpenApiResponse(description="different content already stored at this path; lease_lost"),
        },
    )
    def put(self, request, run_id, path):
        """Store the raw body as the Run's file ``path``, streamed in 1 MiB chunks (member or admin).

        201 when new; 200 when the same bytes are already there (a retry);
        409 when different bytes are (the stored file is untouched); 400 for
        an unsafe ``path`` (absolute, ``..``, backslash, NUL, > 1024 chars),
        an ``X-Mado-Sha256`` mismatch or a body shorter than Content-Length
        (nothing kept).
        """
        run = run_get_for_user(user=request.user, run_id=run_id)
        source, length = upload_source(request)
        artifact, created = services.artifact_store(
            actor=request.user,
            run=run,
            path=path,
            source=source,
            expected_sha256=request.META.get("HTTP_X_MADO_SHA256"),
            expected_size=length,
            fencing_token=fencing_token(request),
        )
        return Response(
            ArtifactOutputSerializer(artifact).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    @extend_schema(
        tags=["artifacts"],
        parameters=[
            OpenApiParameter("path", str, OpenApiParameter.PATH, description=_PATH_DOC),
            OpenApiParameter("Range", str, OpenApiParameter.HEADER, description="bytes=a-b, bytes=a- or bytes=-n"),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            (206, "application/octet-stream"): OpenApiTypes.BINARY,
            404: OpenApiResponse(description="no such artifact in a visible Run"),
            416: OpenApiResponse(description="range selects no byte"),
        },
    )
    def get(self, request, run_id, path):
        """Stream the file's bytes (any member); ``ETag`` and ``X-Mado-Sha256`` carry its SHA-256.

        ``Range: bytes=a-b | a- | -n`` answers 206 with ``Content-Range``
        (resumable download); a range past the end → 416 with
        ``Content-Range: bytes */size``. An ``If-Range`` that is not the ETag
        answers the whole file.
        """
        artifact = selectors.artifact_get_for_user(user=request.user, run_id=run_id, path=path)
        return ranged_download(request, artifact)

    @extend_schema(
        tags=["artifacts"],
        parameters=[OpenApiParameter("path", str, OpenApiParameter.PATH, description=_PATH_DOC)],
        responses={
            204: None,
            403: OpenApiResponse(description="not a project admin"),
            409: OpenApiResponse(description="a checkpoint's tar: delete the checkpoint instead"),
        },
    )
    def delete(self, request, run_id, path):
        """Delete the file: Project admin only (403 otherwise); its bytes go once the delete commits."""
        artifact = selectors.artifact_get_for_user(user=request.user, run_id=run_id, path=path)
        services.artifact_delete(actor=request.user, artifact=artifact)
        return Response(status=status.HTTP_204_NO_CONTENT)
