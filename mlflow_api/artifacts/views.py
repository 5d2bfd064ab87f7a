"""The MLflow artifact proxy ``/api/2.0/mlflow-artifacts/`` (docs/design/checkpoints.md#mlflow-checkpoints, #deletion;
docs/design/interfaces.md#mlflow).

``PUT artifacts/<path>`` streams the raw body into the artifact storage
(never ``request.body``, no size cap: ``checkpoints.storage`` reads 1 MiB at
a time); ``GET`` streams it back with Range; ``GET artifacts?path=`` lists a
directory; ``DELETE`` is for Project admins (docs/design/checkpoints.md#deletion). Multipart upload
(``mpu/create|complete|abort``) goes straight to S3 with presigned part URLs
when the artifact storage is S3; otherwise it answers 501 with the message
the MLflow client recognises, so it falls back to a single streamed PUT. Paths are
checked (``paths.check_path``) before anything is looked up or stored.
A path ``<experiment_id>/models/<model_id>/artifacts/…`` acts the same way on
the files of an MLflow 3 logged model (multipart: always the 501 fallback).
"""

from rest_framework import status
from rest_framework.response import Response

from checkpoints import storage
from checkpoints.api.artifacts import LenientNegotiation, OctetStreamParser, ranged_download, upload_source
from mado import policy
from mlflow_api.artifacts import paths
from mlflow_api.artifacts.base import MlflowApiView, mlflow_error
from mlflow_api.artifacts.checkpoint_files import mlflow_artifact_delete, mlflow_artifact_put
from mlflow_api.artifacts.logged_model_files import logged_model_file_put, logged_model_files_delete
from mlflow_api.artifacts.multipart import mlflow_multipart_abort, mlflow_multipart_complete, mlflow_multipart_create
from mlflow_api.auth import require_own_run
from mlflow_api.errors import NOT_IMPLEMENTED

# The MLflow client falls back to a single PUT when the message starts with exactly this
# (mlflow.exceptions._UnsupportedMultipartUploadException.MESSAGE).
MULTIPART_UNSUPPORTED = "Multipart upload is not supported for the current artifact repository"

MULTIPART_ACTIONS = frozenset({"create", "complete", "abort"})


def _resolve(request, raw: str, *, allow_root: bool = False):
    """``(target, owner)``: the parsed path and the Run or logged model it names (404 when invisible).

    A Run token reaches its own Run's files and the files of logged models that Run produced.
    """
    target = paths.parse_target(raw, allow_root=allow_root)
    if target.model_id:
        model = paths.logged_model_for_target(user=request.user, target=target)
        require_own_run(request, model.run)  # None (logged outside a run): no Run token reaches it
        return target, model
    run = paths.run_for_target(user=request.user, target=target)
    require_own_run(request, run)
    return target, run


class MlflowArtifactListApi(MlflowApiView):
    """``GET artifacts?path=<experiment_id>/<run_id>/artifacts[/<dir>]``."""

    def get(self, request):
        """``{"files": [{"path", "is_dir", "file_size"}]}`` of the directory (any member of the Project)."""
        target, owner = _resolve(request, request.query_params.get("path", ""), allow_root=True)
        return Response({"files": paths.list_directory(files=paths.files_of(owner), path=target.path)})


class MlflowArtifactApi(MlflowApiView):
    """``artifacts/<experiment_id>/<run_id>/artifacts/<path>``: one file of a Run."""

    parser_classes = [OctetStreamParser]
    content_negotiation_class = LenientNegotiation

    def put(self, request, artifact_path):
        """Store the raw body, streamed (member or admin); a ``checkpoints/step-N/`` file joins checkpoint N
        (docs/design/checkpoints.md#mlflow-checkpoints).

        200 ``{}``; the same bytes again is a no-op; different bytes replace
        the file, as on MLflow (its old digest stays in the artifact's
        history), except a checkpoint's file: 409 ``RESOURCE_ALREADY_EXISTS``.
        """
        target, owner = _resolve(request, artifact_path)
        source, length = upload_source(request)
        if target.model_id:
            logged_model_file_put(
                actor=request.user, model=owner, path=target.path, source=source, expected_size=length
            )
        else:
            mlflow_artifact_put(actor=request.user, run=owner, path=target.path, source=source, expected_size=length)
        return Response({})

    def get(self, request, artifact_path):
        """The file's bytes, streamed; ``Range`` answers 206 (any member of the Project)."""
        target, owner = _resolve(request, artifact_path)
        return ranged_download(request, paths.artifact_for_target(files=paths.files_of(owner), target=target))

    def delete(self, request, artifact_path):
        """Delete the file, or every file below the directory: Project admin only, under the checkpoint deletion rules
        (409 for a checkpoint's file)."""
        target, owner = _resolve(request, artifact_path)
        if target.model_id:
            logged_model_files_delete(actor=request.user, model=owner, path=target.path)
        else:
            mlflow_artifact_delete(actor=request.user, run=owner, path=target.path)
        return Response({})


class MlflowMultipartApi(MlflowApiView):
    """``mpu/create|complete|abort/<path>``: multipart upload straight to S3; 501 on any other storage.

    With the S3 artifact storage: ``create`` ``{num_parts}`` →
    ``{"upload_id", "credentials": [{"part_number", "url", "headers"}]}``
    (presigned part URLs); ``complete`` ``{upload_id, parts: [{part_number,
    etag}]}`` records the artifact as a single PUT would (checkpoint files
    included); ``abort`` ``{upload_id}`` discards the parts. Same path
    checks, permissions and run-token scope as the PUT. Otherwise 501 with
    the message that makes the client fall back to one streamed PUT.
    """

    def post(self, request, action, artifact_path):
        """The ``action`` on the upload of ``artifact_path``; 200 (``{}`` for complete and abort)."""
        if action not in MULTIPART_ACTIONS:
            return mlflow_error(NOT_IMPLEMENTED, f"unknown multipart action {action!r}", status.HTTP_404_NOT_FOUND)
        target, owner = _resolve(request, artifact_path)
        # who may not write is told so, not "use a single PUT"
        if target.model_id:
            policy.require_logged_model_writer(request.user, owner)
        else:
            policy.require_run_writer(request.user, owner)
        if storage.s3_storage() is None or target.model_id:
            return mlflow_error(
                NOT_IMPLEMENTED,
                f"{MULTIPART_UNSUPPORTED}: mado streams a single PUT of any size",
                status.HTTP_501_NOT_IMPLEMENTED,
            )
        data = request.data if isinstance(request.data, dict) else {}
        if action == "create":
            return Response(
                mlflow_multipart_create(
                    actor=request.user, run=owner, path=target.path, num_parts=data.get("num_parts")
                )
            )
        if action == "complete":
            mlflow_multipart_complete(
                actor=request.user,
                run=owner,
                path=target.path,
                upload_id=data.get("upload_id"),
                parts=data.get("parts"),
            )
        else:
            mlflow_multipart_abort(actor=request.user, run=owner, path=target.path, upload_id=data.get("upload_id"))
        return Response({})
