"""``codes/{id}/versions/``: a Code's versions, whose source archive the checkpoints app stores as an Artifact."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response

from checkpoints.services import code_version_create_with_archive
from mado.api import PaginatedListApi, valid
from runs import selectors
from runs.api.serializers import CodeVersionInputSerializer, CodeVersionOutputSerializer


class CodeVersionListApi(PaginatedListApi):
    """``codes/{id}/versions/``: versions numbered 1, 2, … with argv and an optional source archive."""

    parser_classes = [MultiPartParser, FormParser, JSONParser]

    @extend_schema(tags=["codes"], responses=CodeVersionOutputSerializer(many=True))
    def get(self, request, code_id):
        """The Code's versions, highest number first (paginated)."""
        code = selectors.code_get_for_user(user=request.user, code_id=code_id)
        return self.paginated(selectors.code_version_list(code=code), CodeVersionOutputSerializer)

    @extend_schema(
        tags=["codes"],
        request={"multipart/form-data": CodeVersionInputSerializer},
        responses={201: CodeVersionOutputSerializer, 400: OpenApiResponse(description="bad entrypoint")},
    )
    def post(self, request, code_id):
        """Add the next version: multipart ``entrypoint`` (JSON argv list as a string) and optional ``archive`` file.

        The archive is streamed into the artifact storage (an Artifact with
        ``run`` NULL); its SHA-256 and size (bytes) come back as
        ``archive_sha256`` / ``archive_size``. Member or admin (viewer → 403).
        """
        code = selectors.code_get_for_user(user=request.user, code_id=code_id)
        data = valid(CodeVersionInputSerializer, request)
        archive = data.get("archive")
        version = code_version_create_with_archive(
            actor=request.user,
            code=code,
            entrypoint=data["entrypoint"],
            archive=archive,
            archive_name=getattr(archive, "name", "") or "archive",
        )
        return Response(CodeVersionOutputSerializer(version).data, status=status.HTTP_201_CREATED)
