"""``/api/v1/tokens/``: a user's API tokens, listed, created (the key shown once) and revoked (docs/api.md#tokens).

Signed in with the session or a password, or with a token of scope ``admin``:
a narrower token cannot make itself a wider one (it may only revoke itself),
and a Run token manages no tokens (``TokenManagement``).
"""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import BasePermission
from rest_framework.response import Response

from mado import tokens
from mado.api import PaginatedListApi, valid
from mado.authentication import run_id_of
from mado.models import ApiToken, TokenScope
from mado.policy import is_service_account

TAG_TOKENS = ["tokens"]
ADMIN_SCOPE_NEEDED = "Tokens are managed with your password, a signed-in session or a token of scope admin."


class TokenManagement(BasePermission):
    """Refuses (403) a Run token and an API token of a scope other than ``admin``."""

    message = ADMIN_SCOPE_NEEDED

    def has_permission(self, request, view) -> bool:
        if run_id_of(request.auth) is not None or is_service_account(request.user):
            return False  # a service account's tokens are made and revoked by its Project's admins
        if request.method == "DELETE" and str(view.kwargs.get("token_id")) == str(getattr(request.auth, "pk", "")):
            return True  # any token may revoke itself (``mado logout``)
        return getattr(request.auth, "scope", TokenScope.ADMIN) == TokenScope.ADMIN


class ApiTokenOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "scope",
            "prefix",
            "created_at",
            "expires_at",
            "last_used_at",
            "last_used_ip",
            "revoked_at",
        ]


class ApiTokenCreatedSerializer(ApiTokenOutputSerializer):
    key = serializers.CharField(help_text="The token itself: shown this once, never again.")

    class Meta(ApiTokenOutputSerializer.Meta):
        fields = [*ApiTokenOutputSerializer.Meta.fields, "key"]


class ApiTokenInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(choices=TokenScope.choices, default=TokenScope.WRITE)
    expires_in_days = serializers.IntegerField(required=False, allow_null=True, min_value=1)


class TokenListApi(PaginatedListApi):
    """``tokens/``: the requesting user's own tokens."""

    permission_classes = [*PaginatedListApi.permission_classes, TokenManagement]
    run_token_allowed = False

    @extend_schema(tags=TAG_TOKENS, responses=ApiTokenOutputSerializer(many=True))
    def get(self, request):
        """The user's tokens, newest first, revoked ones included (paginated); never a key."""
        return self.paginated(tokens.api_token_list(user=request.user), ApiTokenOutputSerializer)

    @extend_schema(
        tags=TAG_TOKENS,
        request=ApiTokenInputSerializer,
        responses={
            201: ApiTokenCreatedSerializer,
            400: OpenApiResponse(description="bad name, scope or lifetime (beyond the server's maximum)"),
            409: OpenApiResponse(description="an unrevoked token of that name exists"),
        },
    )
    def post(self, request):
        """Create ``{name, scope, expires_in_days}`` (scope read, write or admin; lifetime defaults to the
        server's); the answer carries ``key``, shown this once."""
        token, key = tokens.api_token_create(user=request.user, **valid(ApiTokenInputSerializer, request))
        return Response({**ApiTokenOutputSerializer(token).data, "key": key}, status=status.HTTP_201_CREATED)


class TokenDetailApi(GenericAPIView):
    """``tokens/{id}/``: revoke one of the user's tokens."""

    permission_classes = [*GenericAPIView.permission_classes, TokenManagement]
    run_token_allowed = False
    token_read_only = True  # TokenManagement decides: a read token may revoke itself, nothing else

    @extend_schema(tags=TAG_TOKENS, request=None, responses={204: None, 404: OpenApiResponse(description="no such")})
    def delete(self, request, token_id: int):
        """Revoke the token now (idempotent); another user's token is 404."""
        tokens.api_token_revoke(user=request.user, token_id=token_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
