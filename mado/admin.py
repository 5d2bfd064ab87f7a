"""Shared Django admin pieces (docs/design/interfaces.md#surfaces)."""

from django.contrib import admin

from mado.models import ApiToken, AuditEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that shows rows without add, change or delete: for records that only services write."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Every audit record, for superusers (docs/api.md#audit): filterable, never changed."""

    list_display = ["created_at", "actor_kind", "actor_name", "via", "action", "object_repr", "project_id", "address"]
    list_filter = ["actor_kind", "action", "created_at"]
    search_fields = ["actor_name", "object_repr", "request_id", "action"]
    date_hierarchy = "created_at"

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Users' API tokens (never their keys), for superusers."""

    list_display = ["name", "user", "scope", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["scope", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "user__username", "prefix"]
    exclude = ["digest"]
