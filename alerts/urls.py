"""``/api/v1/`` routes of the alerts app (included by ``config.api_urls``)."""

from django.urls import path

from alerts import api

api_patterns = [
    path("projects/<slug:slug>/alert-rules/", api.AlertRuleListApi.as_view(), name="alert-rule-list"),
    path("alert-rules/<int:rule_id>/", api.AlertRuleDetailApi.as_view(), name="alert-rule-detail"),
    path("projects/<slug:slug>/alert-channels/", api.AlertChannelListApi.as_view(), name="alert-channel-list"),
    path("alert-channels/<int:channel_id>/test/", api.AlertChannelTestApi.as_view(), name="alert-channel-test"),
    path("alert-channels/<int:channel_id>/deliveries/", api.AlertDeliveryListApi.as_view(), name="alert-delivery-list"),
    path("runs/<int:run_id>/alerts/", api.RunAlertApi.as_view(), name="run-alerts"),
]
