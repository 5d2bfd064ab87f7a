"""API views for Projects, members, Datasets and Codes (docs/api.md; docs/design/interfaces.md#surfaces).

Each view parses input, fetches through a selector (another Project's object
→ 404), calls one service (which checks ``mado.policy``: viewer → 403) and
serializes. Errors are ``{"error", "detail", "field"}`` (``mado.errors``).
"""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from mado.api import PaginatedListApi, valid
from runs import selectors, services
from runs.api.serializers import (
    CodeOutputSerializer,
    DatasetOutputSerializer,
    DatasetVersionInputSerializer,
    DatasetVersionOutputSerializer,
    MembershipInputSerializer,
    MembershipOutputSerializer,
    MembershipRoleInputSerializer,
    NamedInputSerializer,
    ProjectInputSerializer,
    ProjectOutputSerializer,
)

TAG_PROJECTS = ["projects"]


class ProjectViewSet(GenericViewSet):
    """``projects/`` and ``projects/{slug}/``: the user's Projects (any role)."""

    lookup_field = "slug"

    @extend_schema(tags=TAG_PROJECTS, responses=ProjectOutputSerializer(many=True))
    def list(self, request):
        """The Projects the user is a member of, by name, with the user's ``role`` (paginated)."""
        page = self.paginate_queryset(selectors.project_list_with_roles(user=request.user))
        return self.get_paginated_response(ProjectOutputSerializer(page, many=True, context={"request": request}).data)

    @extend_schema(
        tags=TAG_PROJECTS,
        request=ProjectInputSerializer,
        responses={
            201: ProjectOutputSerializer,
            400: OpenApiResponse(description="empty name/slug"),
            409: OpenApiResponse(description="slug taken"),
        },
    )
    def create(self, request):
        """Create a Project ``{name, slug?}`` (slug defaults to the slugified name); the caller becomes its admin.

        Any authenticated user may create one. 400 names ``name`` or ``slug``; 409 when the slug is taken.
        """
        data = valid(ProjectInputSerializer, request)
        project = services.project_create(user=request.user, name=data["name"], slug=data.get("slug") or None)
        return Response(
            ProjectOutputSerializer(project, context={"request": request}).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        tags=TAG_PROJECTS,
        responses=ProjectOutputSerializer,
        parameters=[OpenApiParameter("slug", str, OpenApiParameter.PATH, description="project slug")],
    )
    def retrieve(self, request, slug=None):
        """One Project by slug; 404 unless the user is a member."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        return Response(ProjectOutputSerializer(project, context={"request": request}).data)


class MemberListApi(PaginatedListApi):
    """``projects/{slug}/members/``: read by any member, changed by admins only."""

    @extend_schema(tags=TAG_PROJECTS, responses=MembershipOutputSerializer(many=True))
    def get(self, request, slug):
        """Members ``{username, role, created_at}`` by username (paginated); 404 for a non-member."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        return self.paginated(selectors.membership_list(project=project), MembershipOutputSerializer)

    @extend_schema(
        tags=TAG_PROJECTS,
        request=MembershipInputSerializer,
        responses={
            201: MembershipOutputSerializer,
            403: OpenApiResponse(description="not a project admin"),
            409: OpenApiResponse(description="already a member"),
        },
    )
    def post(self, request, slug):
        """Add ``{username, role}`` (role: admin, member or viewer). Admin only (403); unknown user → 400
        ``username``."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        data = valid(MembershipInputSerializer, request)
        membership = services.membership_add(actor=request.user, project=project, **data)
        return Response(MembershipOutputSerializer(membership).data, status=status.HTTP_201_CREATED)


class MemberDetailApi(GenericAPIView):
    """``projects/{slug}/members/{username}/``: change a role or remove a member (admin only)."""

    @extend_schema(
        tags=TAG_PROJECTS,
        request=MembershipRoleInputSerializer,
        responses={
            200: MembershipOutputSerializer,
            403: OpenApiResponse(description="not a project admin"),
            409: OpenApiResponse(description="would leave the project without an admin"),
        },
    )
    def patch(self, request, slug, username):
        """Set ``{role}`` of ``username``. Admin only (403); demoting the last admin → 409; non-member → 404."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        data = valid(MembershipRoleInputSerializer, request)
        membership = services.membership_change_role(actor=request.user, project=project, username=username, **data)
        return Response(MembershipOutputSerializer(membership).data)

    @extend_schema(
        tags=TAG_PROJECTS,
        responses={
            204: None,
            403: OpenApiResponse(description="not a project admin"),
            409: OpenApiResponse(description="last admin"),
        },
    )
    def delete(self, request, slug, username):
        """Remove ``username`` from the Project. Admin only (403); removing the last admin → 409."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        services.membership_remove(actor=request.user, project=project, username=username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DatasetListApi(PaginatedListApi):
    """``projects/{slug}/datasets/``."""

    @extend_schema(tags=["datasets"], responses=DatasetOutputSerializer(many=True))
    def get(self, request, slug):
        """The Project's Datasets ``{id, name, created_at}`` by name (paginated)."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        return self.paginated(selectors.dataset_list(project=project), DatasetOutputSerializer)

    @extend_schema(
        tags=["datasets"],
        request=NamedInputSerializer,
        responses={201: DatasetOutputSerializer, 409: OpenApiResponse(description="name taken")},
    )
    def post(self, request, slug):
        """Register a Dataset ``{name}`` (member or admin; viewer → 403; duplicate name → 409)."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        dataset = services.dataset_create(
            actor=request.user, project=project, name=valid(NamedInputSerializer, request)["name"]
        )
        return Response(DatasetOutputSerializer(dataset).data, status=status.HTTP_201_CREATED)


class DatasetVersionListApi(PaginatedListApi):
    """``datasets/{id}/versions/``."""

    @extend_schema(tags=["datasets"], responses=DatasetVersionOutputSerializer(many=True))
    def get(self, request, dataset_id):
        """The Dataset's versions, newest first (paginated); 404 for another Project's Dataset."""
        dataset = selectors.dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        return self.paginated(selectors.dataset_version_list(dataset=dataset), DatasetVersionOutputSerializer)

    @extend_schema(
        tags=["datasets"],
        request=DatasetVersionInputSerializer,
        responses={201: DatasetVersionOutputSerializer, 409: OpenApiResponse(description="version label taken")},
    )
    def post(self, request, dataset_id):
        """Add ``{version, uri?, description?}`` (member or admin; an existing label → 409)."""
        dataset = selectors.dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        version = services.dataset_version_create(
            actor=request.user, dataset=dataset, **valid(DatasetVersionInputSerializer, request)
        )
        return Response(DatasetVersionOutputSerializer(version).data, status=status.HTTP_201_CREATED)


class CodeListApi(PaginatedListApi):
    """``projects/{slug}/codes/``."""

    @extend_schema(tags=["codes"], responses=CodeOutputSerializer(many=True))
    def get(self, request, slug):
        """The Project's registered training programs ``{id, name, created_at}`` (paginated)."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        return self.paginated(selectors.code_list(project=project), CodeOutputSerializer)

    @extend_schema(
        tags=["codes"],
        request=NamedInputSerializer,
        responses={201: CodeOutputSerializer, 409: OpenApiResponse(description="name taken")},
    )
    def post(self, request, slug):
        """Register a Code ``{name}`` (member or admin; duplicate name → 409)."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        code = services.code_create(
            actor=request.user, project=project, name=valid(NamedInputSerializer, request)["name"]
        )
        return Response(CodeOutputSerializer(code).data, status=status.HTTP_201_CREATED)
