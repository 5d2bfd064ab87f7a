"""Django admin of the alerts app (docs/design/interfaces.md#surfaces): rules, channels, firings and the delivery log,
read-only (the services and the API write them; a channel's secret is never shown)."""

from django.contrib import admin

from alerts.models import Channel, Delivery, Firing, Rule
from mado.admin import ReadOnlyAdmin


@admin.register(Rule)
class RuleAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "event", "key", "owner", "enabled", "created_at"]
    list_filter = ["event", "enabled"]
    search_fields = ["name", "project__slug"]


@admin.register(Channel)
class ChannelAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "kind", "target", "last_status", "last_delivery_at"]
    exclude = ["secret"]
    search_fields = ["name", "project__slug"]


@admin.register(Firing)
class FiringAdmin(ReadOnlyAdmin):
    list_display = ["rule", "run", "condition", "quieted", "fired_at"]


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ["idempotency_id", "channel", "email", "status", "attempts", "response_status", "created_at"]
    list_filter = ["status"]
