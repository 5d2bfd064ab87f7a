"""Every route of the MLflow protocol, included once by ``config.urls``.

The tracking API answers under ``api/2.0/mlflow/`` and the artifact proxy
under ``api/2.0/mlflow-artifacts/``; both answer the same under ``mlflow/``
as well, so ``MLFLOW_TRACKING_URI=http://<mado>/mlflow`` works like
``http://<mado>/``. Any other ``2.0/mlflow/`` or ``3.0/mlflow/`` path answers
MLflow's JSON 404 (``ENDPOINT_NOT_FOUND``), never an HTML page.
"""

from django.urls import include, path, re_path

from mlflow_api.artifacts import model_files
from mlflow_api.artifacts import views as artifact_views
from mlflow_api.registry import views as registry
from mlflow_api.tracking import model_views, views

T = "2.0/mlflow/"

R, V = T + "registered-models/", T + "model-versions/"
REGISTRY = [
    path(R + "create", registry.registered_model_create),
    path(R + "get", registry.registered_model_get),
    path(R + "update", registry.registered_model_update),
    path(R + "rename", registry.registered_model_rename),
    path(R + "delete", registry.registered_model_delete),
    path(R + "search", registry.registered_model_search),
    path(R + "get-latest-versions", registry.registered_model_latest_versions),
    path(R + "set-tag", registry.registered_model_set_tag),
    path(R + "delete-tag", registry.registered_model_delete_tag),
    path(R + "alias", registry.registered_model_alias),
    path(V + "create", registry.model_version_create),
    path(V + "get", registry.model_version_get),
    path(V + "update", registry.model_version_update),
    path(V + "delete", registry.model_version_delete),
    path(V + "search", registry.model_version_search),
    path(V + "get-download-uri", registry.model_version_download_uri),
    path(V + "set-tag", registry.model_version_set_tag),
    path(V + "delete-tag", registry.model_version_delete_tag),
    path(V + "transition-stage", registry.model_version_transition_stage),
]

TRACKING = [
    path(T + "experiments/get-by-name", views.experiment_get_by_name),
    path(T + "experiments/get", views.experiment_get),
    path(T + "experiments/create", views.experiment_create),
    path(T + "experiments/search", views.experiment_search),
    path(T + "experiments/delete", views.refused),
    path(T + "experiments/restore", views.refused),
    path(T + "experiments/set-experiment-tag", views.experiment_set_tag),
    path(T + "experiments/delete-experiment-tag", views.experiment_delete_tag),
    path(T + "runs/create", views.run_create),
    path(T + "runs/get", views.run_get),
    path(T + "runs/update", views.run_update),
    path(T + "runs/search", views.run_search),
    path(T + "runs/log-batch", views.run_log_batch),
    path(T + "runs/log-inputs", views.run_log_inputs),
    path(T + "runs/log-metric", views.run_log_metric),
    path(T + "runs/log-parameter", views.run_log_parameter),
    path(T + "runs/set-tag", views.run_set_tag),
    path(T + "runs/delete-tag", views.run_delete_tag),
    path(T + "runs/delete", views.run_delete),
    path(T + "runs/restore", views.run_restore),
    path(T + "metrics/get-history", views.metric_history),
    path(T + "runs/outputs", model_views.run_log_outputs),
    path(T + "runs/log-model", model_views.run_log_model),
    path(T + "logged-models", model_views.logged_model_create),
    path(T + "logged-models/search", model_views.logged_model_search),
    path(T + "logged-models/<str:model_id>", model_views.logged_model_detail),
    path(T + "logged-models/<str:model_id>/tags", model_views.logged_model_set_tags),
    path(T + "logged-models/<str:model_id>/tags/<path:tag_key>", model_views.logged_model_delete_tag),
    path(T + "logged-models/<str:model_id>/params", model_views.logged_model_log_params),
    path(T + "logged-models/<str:model_id>/artifacts/directories", model_files.logged_model_artifacts),
    *REGISTRY,
]

ARTIFACTS = [
    path("artifacts", artifact_views.MlflowArtifactListApi.as_view()),
    # [\s\S]: a path with a newline must reach the checks (and a 400), not fall through to an HTML 404
    re_path(r"^artifacts/(?P<artifact_path>[\s\S]+)\Z", artifact_views.MlflowArtifactApi.as_view()),
    re_path(r"^mpu/(?P<action>[a-z]+)/(?P<artifact_path>[\s\S]+)\Z", artifact_views.MlflowMultipartApi.as_view()),
]

API = [
    *TRACKING,
    path("2.0/mlflow-artifacts/", include(ARTIFACTS)),
    re_path(r"^(?P<rest>2\.0/mlflow/.*|3\.0/mlflow/.*)$", views.not_found),
]

urlpatterns = [
    path("api/", include(API)),
    path("mlflow/api/", include(API)),
]
