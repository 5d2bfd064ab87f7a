"""URLs of the MLflow artifact proxy, included at ``api/2.0/mlflow-artifacts/`` by ``mado.urls``."""

from django.urls import path, re_path

from checkpoints.mlflow_artifacts import views

app_name = "mlflow_artifacts"

urlpatterns = [
    path("artifacts", views.MlflowArtifactListApi.as_view(), name="artifact-list"),
    # [\s\S]: a path with a newline must reach the checks (and a 400), not fall through to an HTML 404
    re_path(r"^artifacts/(?P<artifact_path>[\s\S]+)\Z", views.MlflowArtifactApi.as_view(), name="artifact-detail"),
    re_path(r"^mpu/(?P<action>[a-z]+)/(?P<artifact_path>[\s\S]+)\Z", views.MlflowMultipartApi.as_view(),
            name="multipart"),
]
