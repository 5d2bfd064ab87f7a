"""Shared Django admin pieces (docs/design/interfaces.md#surfaces)."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that shows rows without add, change or delete: for records that only services write."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
