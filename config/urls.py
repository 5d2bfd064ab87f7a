from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from checkpoints import views as checkpoint_views
from config import ops
from jobs import views as job_views
from mado import token_pages
from runs import oidc
from runs import urls as run_urls
from sweeps import urls as sweep_urls

# The Run page's tabs that higher apps serve, under the runs: names the Run page links to
# (docs/design/house.md#arrows), and the Sweep pages, under the runs: names the Project page links to.
RUN_PAGES = [
    *run_urls.urlpatterns,
    *sweep_urls.urlpatterns,
    path("runs/<int:pk>/checkpoints/", checkpoint_views.run_checkpoints, name="run-checkpoints"),
    path("runs/<int:pk>/artifacts/", checkpoint_views.run_artifacts, name="run-artifacts"),
    path("runs/<int:pk>/logs/", job_views.run_logs, name="run-logs"),
]

# Outages raised outside a view (a session or user read from an unreachable database) answer 503 too.
handler500 = "mado.outages.server_error"
handler404 = "mado.outages.not_found"

urlpatterns = [
    # Answered by config.ops.OperatorEndpointsMiddleware before host checks; named here for reverse() and the docs.
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("config.api_urls")),
    path("", include("mlflow_api.urls")),  # the MLflow protocol: api/2.0/mlflow*/, also under mlflow/
    path("accounts/login/", oidc.MadoLoginView.as_view(), name="login"),
    path("oidc/authenticate/", oidc.SignInView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", oidc.CallbackView.as_view(), name="oidc_authentication_callback"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/tokens/", token_pages.token_list, name="token-list"),
    path("accounts/tokens/<int:token_id>/revoke/", token_pages.token_revoke, name="token-revoke"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include((RUN_PAGES, run_urls.app_name))),
    path("", include("checkpoints.urls")),
    path("", include("jobs.urls")),
    path("", include("alerts.urls")),
    path("", include("mlflow_api.registry.urls")),
]
