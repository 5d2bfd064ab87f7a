"""Routes of the alerts app: its pages (``urlpatterns``, included by ``config.urls``) and its ``/api/v1/`` routes
(``api_patterns``, included by ``config.api_urls``)."""

from django.urls import path

from alerts import api, views

app_name = "alerts"

urlpatterns = [
    path("projects/<slug:slug>/alerts/", views.project_alerts, name="project-alerts"),
    path("projects/<slug:slug>/alerts/rules/", views.rule_add, name="rule-add"),
    path("alert-rules/<int:pk>/delete/", views.rule_remove, name="rule-delete"),
    path("projects/<slug:slug>/alerts/channels/", views.channel_add, name="channel-add"),
    path("alert-channels/<int:pk>/send-test/", views.channel_send_test, name="channel-send-test"),
    path("alert-channels/<int:pk>/delete/", views.channel_remove, name="channel-delete"),
    path("projects/<slug:slug>/reliability/", views.project_reliability_page, name="project-reliability"),
]

api_patterns = [
    path("projects/<slug:slug>/alert-rules/", api.AlertRuleListApi.as_view(), name="alert-rule-list"),
    path("alert-rules/<int:rule_id>/", api.AlertRuleDetailApi.as_view(), name="alert-rule-detail"),
    path("projects/<slug:slug>/alert-channels/", api.AlertChannelListApi.as_view(), name="alert-channel-list"),
    path("alert-channels/<int:channel_id>/", api.AlertChannelDetailApi.as_view(), name="alert-channel-detail"),
    path("alert-channels/<int:channel_id>/test/", api.AlertChannelTestApi.as_view(), name="alert-channel-test"),
    path("alert-channels/<int:channel_id>/deliveries/", api.AlertDeliveryListApi.as_view(), name="alert-delivery-list"),
    path("runs/<int:run_id>/alerts/", api.RunAlertApi.as_view(), name="run-alerts"),
    path("projects/<slug:slug>/reliability/", api.ProjectReliabilityApi.as_view(), name="project-reliability"),
]
