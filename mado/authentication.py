"""API token authentication accepting ``Authorization: Bearer <token>`` and ``Token <token>``."""

from rest_framework.authentication import TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    """DRF token auth that also accepts the ``Bearer`` keyword (ARCHITECTURE: API auth)."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() not in self.keywords:
            return None
        token = token.strip()
        if not token or " " in token:
            from rest_framework.exceptions import AuthenticationFailed

            raise AuthenticationFailed("Invalid token header: expected 'Bearer <token>'.")
        return self.authenticate_credentials(token)

    def authenticate_header(self, request):
        return "Bearer"
