"""``api/2.0/mlflow/logged-models/<model_id>/artifacts/directories``: the files of an MLflow 3 logged model
(docs/design/interfaces.md#mlflow).

An endpoint of the MLflow tracking API (``mlflow_api.tracking.views.endpoint``: auth and
error shape) that reads Artifacts; ``mlflow_api.urls`` routes it
ahead of the tracking API's catch-all.
"""

import posixpath

from mlflow_api.artifacts.paths import PATH_MAX, check_path, files_of, list_directory
from mlflow_api.tracking.logged_models import artifact_uri
from mlflow_api.tracking.model_views import request_model
from mlflow_api.tracking.translate import str_arg
from mlflow_api.tracking.views import endpoint


@endpoint("GET", run_token_allowed=True)
def logged_model_artifacts(request, user, data, model_id):
    """``?artifact_directory_path=<dir>`` (default: the root) →
    ``{"root_uri", "files": [{"path", "is_dir", "file_size"?}]}``, each path from the model's root.

    Any reader of the Project (404 RESOURCE_DOES_NOT_EXIST otherwise, or for
    a deleted model); a Run token only for its Run's models (403); an unsafe
    directory path → 400 INVALID_PARAMETER_VALUE.
    """
    model = request_model(request, user, model_id)
    directory = str_arg(data, "artifact_directory_path", required=False, max_length=PATH_MAX)
    if directory:
        check_path(directory)
    files = list_directory(files=files_of(model), path=directory)
    for entry in files:
        entry["path"] = posixpath.join(directory, entry["path"])
    return {"root_uri": artifact_uri(model), "files": files}
