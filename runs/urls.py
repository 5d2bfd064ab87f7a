"""Page URLs of Projects, Runs and members (names ``runs:<entity>-<page>``).

The Run page's tabs served by higher apps (Checkpoint, Artifacts, Logs) and the
Sweep pages join these in ``config.urls`` (the roof), so runs imports neither
sweeps, checkpoints nor jobs.
"""

from django.urls import path

from runs import audit_pages, service_account_pages, views

app_name = "runs"

urlpatterns = [
    path("", views.project_list, name="project-list"),
    path("projects/<slug:slug>/", views.project_detail, name="project-detail"),
    path("projects/<slug:slug>/runs.csv", views.project_runs_csv, name="project-runs-csv"),
    path("projects/<slug:slug>/columns/", views.project_columns, name="project-columns"),
    path("projects/<slug:slug>/compare/", views.project_compare, name="project-compare"),
    path("projects/<slug:slug>/members/", views.project_members, name="project-members"),
    path("projects/<slug:slug>/members/<str:username>/role/", views.member_role, name="member-role"),
    path("projects/<slug:slug>/members/<str:username>/remove/", views.member_remove, name="member-remove"),
    path(
        "projects/<slug:slug>/service-accounts/",
        service_account_pages.service_account_create,
        name="service-account-create",
    ),
    path(
        "projects/<slug:slug>/service-accounts/<slug:name>/tokens/",
        service_account_pages.service_account_token_create,
        name="service-account-token-create",
    ),
    path(
        "projects/<slug:slug>/service-accounts/<slug:name>/tokens/<int:token_id>/revoke/",
        service_account_pages.service_account_token_revoke,
        name="service-account-token-revoke",
    ),
    path("projects/<slug:slug>/audit/", audit_pages.project_audit, name="project-audit"),
    path("projects/<slug:slug>/audit.csv", audit_pages.project_audit_csv, name="project-audit-csv"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/charts/", views.run_charts, name="run-charts"),
    path("runs/<int:pk>/system/", views.run_system, name="run-system"),
    path("runs/<int:pk>/data-history/", views.run_data_history, name="run-data-history"),
]
