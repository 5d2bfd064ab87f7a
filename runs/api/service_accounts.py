"""``projects/{slug}/service-accounts/``: a Project's service accounts and their tokens (docs/api.md#service-accounts).
Project admins only (403 for other members, 404 outside the Project)."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from mado.api import valid
from mado.token_api import ApiTokenCreatedSerializer, ApiTokenInputSerializer, ApiTokenOutputSerializer
from runs import selectors
from runs import service_accounts as services
from runs.models import Role

TAG = ["service accounts"]


class ServiceAccountOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    username = serializers.CharField(source="user.username")
    role = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    tokens = serializers.SerializerMethodField()

    def get_role(self, account) -> str:
        return next((m.role for m in account.user.memberships.all() if m.project_id == account.project_id), "")

    def get_tokens(self, account) -> list[dict]:
        return ApiTokenOutputSerializer(account.user.api_tokens.all(), many=True).data


class ServiceAccountInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=50)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class ServiceAccountListApi(GenericAPIView):
    """``projects/{slug}/service-accounts/``."""

    run_token_allowed = False

    @extend_schema(tags=TAG, responses=ServiceAccountOutputSerializer(many=True))
    def get(self, request, slug):
        """The Project's service accounts with their role and tokens (never a key)."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        accounts = services.service_account_list(actor=request.user, project=project)
        return Response(ServiceAccountOutputSerializer(accounts, many=True).data)

    @extend_schema(
        tags=TAG,
        request=ServiceAccountInputSerializer,
        responses={201: ServiceAccountOutputSerializer, 409: OpenApiResponse(description="the name is taken")},
    )
    def post(self, request, slug):
        """Make ``{name, role}`` (role default member); its user ``<slug>.<name>`` never signs in."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        account = services.service_account_create(
            actor=request.user, project=project, **valid(ServiceAccountInputSerializer, request)
        )
        return Response(ServiceAccountOutputSerializer(account).data, status=status.HTTP_201_CREATED)


class ServiceAccountTokenListApi(GenericAPIView):
    """``projects/{slug}/service-accounts/{name}/tokens/``: make a token for the account."""

    run_token_allowed = False

    @extend_schema(tags=TAG, request=ApiTokenInputSerializer, responses={201: ApiTokenCreatedSerializer})
    def post(self, request, slug, name):
        """``{name, scope, expires_in_days}`` as for ``tokens/``; the answer's ``key`` is shown this once."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        account = services.service_account_get(actor=request.user, project=project, name=name)
        data = valid(ApiTokenInputSerializer, request)
        token, key = services.service_account_token_create(actor=request.user, account=account, **data)
        return Response({**ApiTokenOutputSerializer(token).data, "key": key}, status=status.HTTP_201_CREATED)


class ServiceAccountTokenDetailApi(GenericAPIView):
    """``projects/{slug}/service-accounts/{name}/tokens/{id}/``: revoke one of the account's tokens."""

    run_token_allowed = False

    @extend_schema(tags=TAG, request=None, responses={204: None})
    def delete(self, request, slug, name, token_id: int):
        """Revoke now (idempotent); a token of another user is 404."""
        project = selectors.project_get_for_user(user=request.user, slug=slug)
        account = services.service_account_get(actor=request.user, project=project, name=name)
        services.service_account_token_revoke(actor=request.user, account=account, token_id=token_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
