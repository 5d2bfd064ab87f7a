from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

# Outages raised outside a view (a session or user read from an unreachable database) answer 503 too.
handler500 = "mado.outages.server_error"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("mado.api_urls")),
    path("api/", include("runs.mlflow.urls")),  # MLflow tracking API: api/2.0/mlflow/ (+ api/3.0/mlflow/ → 404)
    path("api/2.0/mlflow-artifacts/", include("checkpoints.mlflow_artifacts.urls")),
    # The same MLflow API under a path prefix: MLFLOW_TRACKING_URI=http://<mado>/mlflow works too.
    path("mlflow/api/", include("runs.mlflow.urls")),
    path(
        "mlflow/api/2.0/mlflow-artifacts/",
        include(("checkpoints.mlflow_artifacts.urls", "mlflow_artifacts"), namespace="mlflow_artifacts_prefixed"),
    ),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include("runs.urls")),
    path("", include("checkpoints.urls")),
    path("", include("jobs.urls")),
]
