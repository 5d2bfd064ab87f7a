"""Page URLs of the model registry (names ``registry:<entity>-<page>``)."""

from django.urls import path

from mlflow_api.registry import pages

app_name = "registry"

urlpatterns = [
    path("projects/<slug:slug>/models/", pages.model_list, name="model-list"),
    path("models/<int:pk>/", pages.model_detail, name="model-detail"),
    path("checkpoints/<int:pk>/register/", pages.checkpoint_register, name="checkpoint-register"),
]
