from rest_framework.pagination import PageNumberPagination


class DefaultPagination(PageNumberPagination):
    """``{"count", "next", "previous", "results"}`` pages; ``?page_size=`` up to 1000."""

    page_size_query_param = "page_size"
    max_page_size = 1000
