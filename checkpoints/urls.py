"""Page URLs of Checkpoints and Artifacts (names ``checkpoints:<entity>-<page>``).

The Run page's Checkpoint and Artifacts tabs are ``runs:run-checkpoints`` and
``runs:run-artifacts`` (runs/urls.py), served by ``checkpoints.views``.
"""

from django.urls import path

from checkpoints import storage_views, views

app_name = "checkpoints"

urlpatterns = [
    path("checkpoints/<int:pk>/", views.checkpoint_detail, name="checkpoint-detail"),
    path("checkpoints/<int:pk>/delete/", views.checkpoint_delete, name="checkpoint-delete"),
    path("runs/<int:pk>/artifacts/delete/", views.artifact_delete, name="artifact-delete"),
    path("projects/<slug:slug>/storage/", storage_views.project_storage, name="project-storage"),
    path("projects/<slug:slug>/storage/policy/", storage_views.project_retention_save, name="retention-save"),
    path("projects/<slug:slug>/storage/apply/", storage_views.project_retention_apply, name="retention-apply"),
    path(
        "projects/<slug:slug>/checkpoints/bulk-delete/",
        storage_views.project_checkpoints_bulk_delete,
        name="checkpoint-bulk-delete",
    ),
]
