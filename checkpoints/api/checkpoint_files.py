"""API view of one file of a checkpoint saved through MLflow (``layout: "files"``, one stored file per manifest
entry): ``GET checkpoints/{id}/files/<path>`` (docs/api.md "Checkpoints";
docs/design/checkpoints.md#mlflow-checkpoints; docs/design/worker.md#fetch).

What ``mado checkpoint restore``, ``mado agent`` and a same-run resume read
when the checkpoint has no tar: the same permission as the tar download (any
member or viewer of the Project), the same streamed, ranged answer. ``path`` is
looked up in the checkpoint's manifest only.
"""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.views import APIView

from checkpoints import selectors
from checkpoints.api.artifacts import LenientNegotiation, ranged_download
from checkpoints.services import integrity


class CheckpointFileApi(APIView):
    """``checkpoints/{id}/files/<path>``: ranged download of one file of a ``layout: "files"`` checkpoint."""

    content_negotiation_class = LenientNegotiation

    @extend_schema(
        tags=["checkpoints"],
        parameters=[
            OpenApiParameter("checkpoint_id", int, OpenApiParameter.PATH, description="checkpoint id"),
            OpenApiParameter("path", str, OpenApiParameter.PATH, description="a path of the checkpoint's manifest"),
            OpenApiParameter("Range", str, OpenApiParameter.HEADER, description="bytes=a-b, bytes=a- or bytes=-n"),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            (206, "application/octet-stream"): OpenApiTypes.BINARY,
            404: OpenApiResponse(description="no such checkpoint, or no such file in its manifest"),
            409: OpenApiResponse(description="not complete (pending or deleted), or stored as one tar (GET tar)"),
            410: OpenApiResponse(description="checkpoint_corrupt: a stored file is missing or differs"),
            416: OpenApiResponse(description="range selects no byte"),
        },
    )
    def get(self, request, checkpoint_id, path):
        """The file ``path`` of a complete checkpoint saved through MLflow, streamed (any member or viewer).

        ``ETag`` and ``X-Mado-Sha256`` carry its SHA-256 (the manifest's);
        ``Range`` resumes a broken download (206), ``If-Range`` as for the tar.
        A checkpoint stored as one tar answers 409 (download ``GET
        checkpoints/{id}/tar``).
        """
        checkpoint = selectors.checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        integrity.checkpoint_refuse_corrupt(checkpoint)
        artifact = selectors.checkpoint_file_artifact(checkpoint=checkpoint, path=path)
        return ranged_download(request, artifact)
