"""Page URLs of the model registry (names ``registry:<entity>-<page>``)."""

from django.urls import path

from mlflow_api.registry import pages

app_name = "registry"

urlpatterns = [
    path("projects/<slug:slug>/models/", pages.model_list, name="model-list"),
    path("models/<int:pk>/", pages.model_detail, name="model-detail"),
    path("models/<int:pk>/aliases/", pages.alias_set, name="alias-set"),
    path("models/<int:pk>/aliases/<str:alias>/delete/", pages.alias_delete, name="alias-delete"),
    path("models/<int:pk>/versions/<int:version>/delete/", pages.version_delete, name="version-delete"),
    path("checkpoints/<int:pk>/register/", pages.checkpoint_register, name="checkpoint-register"),
]
