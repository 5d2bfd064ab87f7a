"""Routes of the MLflow tracking API, included at ``api/`` by ``mado.urls`` (``api/2.0/mlflow/…``)."""

from django.urls import path, re_path

from runs.mlflow import model_views, views

P = "2.0/mlflow/"

urlpatterns = [
    path(P + "experiments/get-by-name", views.experiment_get_by_name),
    path(P + "experiments/get", views.experiment_get),
    path(P + "experiments/create", views.experiment_create),
    path(P + "experiments/search", views.experiment_search),
    path(P + "experiments/delete", views.refused),
    path(P + "experiments/restore", views.refused),
    path(P + "experiments/set-experiment-tag", views.experiment_set_tag),
    path(P + "experiments/delete-experiment-tag", views.experiment_delete_tag),
    path(P + "runs/create", views.run_create),
    path(P + "runs/get", views.run_get),
    path(P + "runs/update", views.run_update),
    path(P + "runs/search", views.run_search),
    path(P + "runs/log-batch", views.run_log_batch),
    path(P + "runs/log-inputs", views.run_log_inputs),
    path(P + "runs/log-metric", views.run_log_metric),
    path(P + "runs/log-parameter", views.run_log_parameter),
    path(P + "runs/set-tag", views.run_set_tag),
    path(P + "runs/delete-tag", views.run_delete_tag),
    path(P + "runs/delete", views.run_delete),
    path(P + "runs/restore", views.run_restore),
    path(P + "metrics/get-history", views.metric_history),
    path(P + "runs/outputs", model_views.run_log_outputs),
    path(P + "runs/log-model", model_views.run_log_model),
    path(P + "logged-models", model_views.logged_model_create),
    path(P + "logged-models/search", model_views.logged_model_search),
    path(P + "logged-models/<str:model_id>", model_views.logged_model_detail),
    path(P + "logged-models/<str:model_id>/tags", model_views.logged_model_set_tags),
    path(P + "logged-models/<str:model_id>/tags/<path:tag_key>", model_views.logged_model_delete_tag),
    path(P + "logged-models/<str:model_id>/params", model_views.logged_model_log_params),
    re_path(r"^(?P<rest>2\.0/mlflow/.*|3\.0/mlflow/.*)$", views.not_found),
]
