"""What every app's API views share: validated input, paginated lists, integers read from a request.

Views of ``/api/v1/`` answer errors as ``{"error", "detail", "field"}``
(``mado.errors``); the helpers here raise those errors, naming the field
(docs/design/house.md#bad-input).
"""

from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from mado.errors import ValidationFailed


class PaginatedListApi(GenericAPIView):
    """A list endpoint: paginate a selector's queryset through ``DefaultPagination``."""

    def paginated(self, queryset, serializer_class) -> Response:
        page = self.paginate_queryset(queryset)
        data = serializer_class(page, many=True, context=self.get_serializer_context()).data
        return self.get_paginated_response(data)


def valid(serializer_class, request) -> dict:
    """Validated input of ``serializer_class`` for ``request.data``; a 400 naming the field otherwise."""
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def request_int(raw: str | None, name: str, *, default: int | None = None, minimum: int = 0) -> int | None:
    """``raw`` (a query parameter, header or ``META`` value of a request) as an integer >= ``minimum``.

    ``default`` when ``raw`` is None or empty. Raises ``ValidationFailed``
    (400) naming ``name`` for anything else: text ``int()`` does not read as
    an integer, or a value below ``minimum`` ("a positive integer" for a
    minimum of 1).
    """
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValidationFailed(f"{name} must be {wanted}, got {raw!r}", field=name)
    return value
