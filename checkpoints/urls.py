"""Page URLs of Checkpoints and Artifacts (names ``checkpoints:<entity>-<page>``).

The Run page's Checkpoint and Artifacts tabs are ``runs:run-checkpoints`` and
``runs:run-artifacts`` (runs/urls.py), served by ``checkpoints.views``.
"""

from django.urls import path

from checkpoints import views

app_name = "checkpoints"

urlpatterns = [
    path("checkpoints/<int:pk>/", views.checkpoint_detail, name="checkpoint-detail"),
    path("checkpoints/<int:pk>/delete/", views.checkpoint_delete, name="checkpoint-delete"),
    path("runs/<int:pk>/artifacts/delete/", views.artifact_delete, name="artifact-delete"),
]
