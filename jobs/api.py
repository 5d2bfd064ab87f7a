"""API views for Jobs, Queues and Run logs (docs/api.md "Jobs"; docs/design/resume.md; docs/design/worker.md).

Thin views (docs/design/house.md#views): validate the input shape, fetch through a selector
(another Project's Job, checkpoint or code version → 404), call one service
(which checks ``mado.policy``: viewer or non-creator member → 403, wrong
state → 409 with the reason) and serialize. Errors are ``{"error",
"detail", "field"}`` (``mado.errors``).
"""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import GenericViewSet

from checkpoints.selectors import checkpoint_get_for_user
from jobs import selectors, services
from jobs.models import JobKind, JobStatus, Runner
from jobs.services._common import NPROC_PER_NODE_LIMIT
from mado.api import request_int, valid
from mado.errors import NotFound, ValidationFailed
from parity.serializers import ResumeFactsMixin
from runs.api.serializers import run_page_url
from runs.models import CodeVersion, RunKind
from runs.selectors import project_get_for_user

TAGS = ["jobs"]
_NPROC_HELP = f"processes per node (1..{NPROC_PER_NODE_LIMIT}): above 1 the worker starts the code under torchrun."
_JOB_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="job id")
_CHECKPOINT_ID = OpenApiParameter("checkpoint_id", int, OpenApiParameter.PATH, description="checkpoint id")
_IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="the same key again (same user) returns the first Job instead of creating a second",
)


class QueueOutputSerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True)
    description = serializers.CharField(read_only=True)
    runner = serializers.ChoiceField(choices=Runner.choices, read_only=True)
    image = serializers.CharField(read_only=True, help_text="container image (container runner only)")


class JobOutputSerializer(ResumeFactsMixin, serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    project = serializers.CharField(source="run.project.slug", read_only=True, help_text="project slug")
    run_id = serializers.IntegerField(read_only=True)
    run_external_id = serializers.CharField(source="run.external_id", read_only=True)
    run_name = serializers.CharField(source="run.name", read_only=True)
    run_kind = serializers.ChoiceField(source="run.kind", choices=RunKind.choices, read_only=True)
    run_status = serializers.CharField(source="run.status", read_only=True)
    code_id = serializers.IntegerField(source="code_version.code_id", read_only=True)
    code = serializers.CharField(source="code_version.code.name", read_only=True, help_text="the Code's name")
    code_version_id = serializers.IntegerField(read_only=True)
    code_version = serializers.IntegerField(source="code_version.version", read_only=True, help_text="version number")
    queue = serializers.CharField(source="queue.name", read_only=True)
    kind = serializers.ChoiceField(choices=JobKind.choices, read_only=True)
    resumed = serializers.BooleanField(source="is_resumed", read_only=True, help_text="the Jobs list's badge")
    status = serializers.ChoiceField(choices=JobStatus.choices, read_only=True)
    waiting_for_queue = serializers.BooleanField(
        read_only=True,
        help_text="queued, but the message broker has not taken the Job yet (it is unreachable); "
        "the server sends it as soon as the broker is back",
    )
    created_by = serializers.CharField(source="created_by.username", read_only=True, help_text="username")
    max_retries = serializers.IntegerField(read_only=True)
    max_restarts = serializers.IntegerField(
        read_only=True, help_text="automatic resumes from the latest checkpoint after a preemption or a lost worker"
    )
    restarts = serializers.IntegerField(read_only=True, help_text="automatic restarts before this Job in its chain")
    restart_of_id = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="the preempted Job this automatic restart resumes"
    )
    restart_id = serializers.SerializerMethodField(help_text="this Job's automatic restart, if it was restarted")
    nproc_per_node = serializers.IntegerField(read_only=True, help_text="processes under torchrun; 1: no torchrun")
    nnodes = serializers.IntegerField(
        read_only=True, help_text="nodes for a multi-node runner; the Celery worker runs 1"
    )
    attempt = serializers.IntegerField(read_only=True, help_text="1-based")
    retry_of_id = serializers.IntegerField(read_only=True, allow_null=True)
    resumed_from_run_id = serializers.IntegerField(source="resumed_from_id", read_only=True, allow_null=True)
    source_checkpoint_id = serializers.IntegerField(source="run.source_checkpoint_id", read_only=True, allow_null=True)
    source_checkpoint_step = serializers.IntegerField(
        source="run.source_checkpoint.step", read_only=True, allow_null=True, default=None
    )
    exit_code = serializers.IntegerField(read_only=True, allow_null=True)
    error = serializers.CharField(read_only=True)
    worker_host = serializers.CharField(read_only=True)
    heartbeat_at = serializers.DateTimeField(read_only=True, allow_null=True)
    abort_requested_at = serializers.DateTimeField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)
    started_at = serializers.DateTimeField(read_only=True, allow_null=True)
    ended_at = serializers.DateTimeField(read_only=True, allow_null=True)
    duration_seconds = serializers.FloatField(read_only=True, allow_null=True)
    run_url = serializers.SerializerMethodField(help_text="absolute URL of the Run page")

    def get_run_url(self, job) -> str:
        return run_page_url(self.context.get("request"), job.run)

    def get_restart_id(self, job) -> int | None:
        restart = getattr(job, "restart", None)
        return restart.pk if restart else None

    @staticmethod
    def run_of(job):
        return job.run


class JobDetailOutputSerializer(JobOutputSerializer):
    resume_refusal = serializers.SerializerMethodField(
        help_text="null when the requesting user may resume this Job's Run from its latest checkpoint, else why not"
    )

    def get_resume_refusal(self, job) -> str | None:
        return selectors.resume_refusal(user=self.context["request"].user, run=job.run)


class JobLaunchInputSerializer(serializers.Serializer):
    code_version_id = serializers.IntegerField(help_text="the Code version to run; its Project is the Job's")
    queue = serializers.SlugField(required=False, help_text="queue name (default: the server's default queue)")
    parameters = serializers.JSONField(required=False, default=dict, help_text="a JSON object")
    input_dataset_version_ids = serializers.ListField(child=serializers.IntegerField(), required=False, default=list)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(
        choices=RunKind.choices, required=False, default=RunKind.TRAINING, help_text="run kind"
    )
    max_retries = serializers.IntegerField(
        min_value=0,
        max_value=10,
        required=False,
        default=0,
        help_text="automatic fresh attempts after a failure; a retry starts the code again without any checkpoint",
    )
    max_restarts = serializers.IntegerField(
        min_value=0,
        max_value=10,
        required=False,
        default=None,
        allow_null=True,
        help_text="automatic resumes from the latest checkpoint after a preemption or a lost worker "
        "(default: the Project's job_max_restarts)",
    )
    nproc_per_node = serializers.IntegerField(
        min_value=1,
        max_value=NPROC_PER_NODE_LIMIT,
        required=False,
        default=1,
        help_text=_NPROC_HELP,
    )


class JobResumeInputSerializer(serializers.Serializer):
    code_version_id = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text="a version of the same Code (default: the source Job's)",
    )
    queue = serializers.SlugField(required=False, allow_null=True, default=None, help_text="default: the source Job's")
    nproc_per_node = serializers.IntegerField(
        min_value=1,
        max_value=NPROC_PER_NODE_LIMIT,
        required=False,
        allow_null=True,
        default=None,
        help_text=f"{_NPROC_HELP} Default: the source Job's; another count loads a sharded checkpoint resharded.",
    )


class RunLogChunkOutputSerializer(serializers.Serializer):
    seq = serializers.IntegerField(read_only=True)
    text = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)


class JobLogOutputSerializer(serializers.Serializer):
    results = RunLogChunkOutputSerializer(many=True)
    next_after_seq = serializers.IntegerField(help_text="pass as after_seq to get what follows")
    job_status = serializers.ChoiceField(choices=JobStatus.choices)
    finished = serializers.BooleanField(help_text="the Job ended and no chunk follows: stop polling")
    truncated = serializers.BooleanField(help_text="the log reached MADO_JOB_LOG_MAX_BYTES")


def _code_version(user, code_version_id) -> CodeVersion | None:
    if code_version_id is None:
        return None
    version = CodeVersion.objects.visible_to(user).select_related("code__project").filter(pk=code_version_id).first()
    if version is None:
        raise NotFound(f"code version {code_version_id} not found", field="code_version_id")
    return version


def _resume_options(request) -> dict:
    data = valid(JobResumeInputSerializer, request)
    queue = selectors.queue_get(name=data["queue"]) if data["queue"] else None
    return {
        "code_version": _code_version(request.user, data["code_version_id"]),
        "queue": queue,
        "nproc_per_node": data["nproc_per_node"],
    }


def _job_response(request, job, code=status.HTTP_200_OK) -> Response:
    job = selectors.job_get_for_user(user=request.user, job_id=job.pk)
    return Response(JobDetailOutputSerializer(job, context={"request": request}).data, status=code)


_BAD_RESUME_OPTION = OpenApiResponse(description="code version of another Code, unknown or disabled queue")
_COMMAND_ERRORS = {
    403: OpenApiResponse(description="viewer, or a member who did not create the Run (creator or project admin only)"),
    404: OpenApiResponse(description="not in the user's projects"),
    409: OpenApiResponse(
        description="the reason: still running, finished (use continue), no checkpoint, "
        "checkpoint not complete, kind or Code mismatch, already being resumed"
    ),
}


class JobViewSet(GenericViewSet):
    """``jobs/``: launch, list and read Jobs; abort, resume from latest and read the log of one."""

    lookup_value_regex = "[0-9]+"

    @extend_schema(
        tags=TAGS,
        parameters=[
            OpenApiParameter("project", str, description="project slug (404 unless a member)"),
            OpenApiParameter("status", str, description="queued, running, succeeded, failed or aborted"),
        ],
        responses=JobOutputSerializer(many=True),
    )
    def list(self, request):
        """Jobs of the user's Projects, newest first (paginated); ``?project=&status=`` filter."""
        slug = request.query_params.get("project")
        project = project_get_for_user(user=request.user, slug=slug) if slug else None
        job_status = request.query_params.get("status") or None
        if job_status and job_status not in JobStatus.values:
            raise ValidationFailed(
                f"unknown status {job_status!r}; one of {', '.join(JobStatus.values)}", field="status"
            )
        page = self.paginate_queryset(selectors.job_list(user=request.user, project=project, status=job_status))
        return self.get_paginated_response(JobOutputSerializer(page, many=True, context={"request": request}).data)

    @extend_schema(
        tags=TAGS,
        request=JobLaunchInputSerializer,
        parameters=[_IDEMPOTENCY_KEY],
        responses={
            201: JobDetailOutputSerializer,
            400: OpenApiResponse(description="bad field (named)"),
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="code version not visible"),
        },
    )
    def create(self, request):
        """Launch ``{code_version_id, queue?, parameters?, input_dataset_version_ids?, name?, kind?, max_retries?,
        max_restarts?, nproc_per_node?}``.

        Creates a pending Run and a queued Job in the Code's Project (member
        or admin) and sends it to the queue. ``max_retries`` automatic
        retries start the code again from scratch, never from a checkpoint;
        ``max_restarts`` automatic restarts resume a preempted Job (or one whose worker was lost) from its
        latest checkpoint, default the Project's setting. ``nproc_per_node`` > 1 runs the code under torchrun.
        """
        data = valid(JobLaunchInputSerializer, request)
        queue = selectors.queue_get(name=data.get("queue") or selectors.default_queue_name())
        job = services.job_launch(
            actor=request.user,
            code_version=_code_version(request.user, data["code_version_id"]),
            queue=queue,
            parameters=data["parameters"],
            dataset_version_ids=data["input_dataset_version_ids"],
            name=data["name"],
            kind_of_run=data["kind"],
            max_retries=data["max_retries"],
            max_restarts=data["max_restarts"],
            nproc_per_node=data["nproc_per_node"],
            request_key=request.headers.get("Idempotency-Key"),
        )
        return _job_response(request, job, status.HTTP_201_CREATED)

    @extend_schema(tags=TAGS, parameters=[_JOB_ID], responses=JobDetailOutputSerializer)
    def retrieve(self, request, pk=None):
        """One Job with ``error``, and ``resume_refusal`` (null when the user may resume it from latest)."""
        job = selectors.job_get_for_user(user=request.user, job_id=pk)
        return Response(JobDetailOutputSerializer(job, context={"request": request}).data)

    @extend_schema(
        tags=TAGS,
        parameters=[_JOB_ID],
        request=None,
        responses={200: JobDetailOutputSerializer, **_COMMAND_ERRORS},
    )
    @action(detail=True, methods=["post"])
    def abort(self, request, pk=None):
        """Abort: a queued Job ends ``aborted`` at once; a running one when its worker has stopped the code.

        Creator or project admin. Aborting an aborted Job → 200; another ended Job → 409.
        """
        job = selectors.job_get_for_user(user=request.user, job_id=pk)
        return _job_response(request, services.job_abort(actor=request.user, job=job))

    @extend_schema(
        tags=TAGS,
        parameters=[_JOB_ID],
        request=JobResumeInputSerializer,
        responses={201: JobDetailOutputSerializer, 400: _BAD_RESUME_OPTION, **_COMMAND_ERRORS},
    )
    @action(detail=True, methods=["post"], url_path="resume-latest")
    def resume_latest(self, request, pk=None):
        """Resume the failed/aborted Job's Run from its latest checkpoint as a new Run and Job: 201 the new Job.

        Latest = the Run's complete checkpoint with the highest step, else
        (a resumed Run that saved none) its own source checkpoint.
        """
        job = selectors.job_get_for_user(user=request.user, job_id=pk)
        new = services.job_resume_from_latest(actor=request.user, job=job, **_resume_options(request))
        return _job_response(request, new, status.HTTP_201_CREATED)

    @extend_schema(
        tags=TAGS,
        parameters=[
            _JOB_ID,
            OpenApiParameter("after_seq", int, description="return chunks after this seq (default 0)"),
            OpenApiParameter("limit", int, description="at most this many chunks (default and max 1000)"),
        ],
        responses=JobLogOutputSerializer,
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The code's output after ``after_seq``: poll with ``next_after_seq`` until ``finished``."""
        job = selectors.job_get_for_user(user=request.user, job_id=pk)
        after = request_int(request.query_params.get("after_seq"), "after_seq", default=0)
        chunks = selectors.run_log_tail(
            run=job.run,
            after_seq=after,
            limit=request_int(request.query_params.get("limit"), "limit", default=selectors.LOG_PAGE_MAX),
        )
        next_after = chunks[-1].seq if chunks else after
        body = {
            "results": chunks,
            "next_after_seq": next_after,
            "job_status": job.status,
            "finished": job.is_final and not chunks,
            "truncated": job.log_truncated,
        }
        return Response(JobLogOutputSerializer(body).data)


class CheckpointResumeApi(APIView):
    """``checkpoints/{id}/resume/``: "Resume from this checkpoint"."""

    run_token_allowed = False  # a Job's own token never launches Jobs (mado.authentication.RunTokenScope)

    @extend_schema(
        tags=TAGS,
        parameters=[_CHECKPOINT_ID],
        request=JobResumeInputSerializer,
        responses={201: JobDetailOutputSerializer, 400: _BAD_RESUME_OPTION, **_COMMAND_ERRORS},
    )
    def post(self, request, checkpoint_id):
        """Resume the checkpoint's failed/aborted Run from this checkpoint as a new Run and Job: 201 the new Job.

        "Training will resume as a new Run from the checkpoint at step N."
        The new Run records the parent Run and the checkpoint; the source Run
        is not changed. Optional ``code_version_id`` (same Code) and ``queue``.
        """
        checkpoint = checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        job = services.run_resume_from_checkpoint(actor=request.user, checkpoint=checkpoint, **_resume_options(request))
        return _job_response(request, job, status.HTTP_201_CREATED)


class JobContinueInputSerializer(serializers.Serializer):
    code_version_id = serializers.IntegerField(help_text="a version of the source Run's Code (any, if it has none)")
    queue = serializers.SlugField(
        required=False,
        allow_null=True,
        default=None,
        help_text="queue name (default: the source Run's Job's, else the server's default)",
    )
    parameters = serializers.JSONField(
        required=False, allow_null=True, default=None, help_text="a JSON object (default: the source Run's parameters)"
    )
    input_dataset_version_ids = serializers.ListField(
        child=serializers.IntegerField(),
        allow_empty=True,
        help_text="the new Run's dataset versions, e.g. the composition at the checkpoint's step plus new ones",
    )
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    nproc_per_node = serializers.IntegerField(
        min_value=1,
        max_value=NPROC_PER_NODE_LIMIT,
        required=False,
        allow_null=True,
        default=None,
        help_text=f"{_NPROC_HELP} Default: the source Run's Job's, else 1.",
    )


class CheckpointContinueApi(APIView):
    """``checkpoints/{id}/continue/``: "Continue training from these weights"."""

    run_token_allowed = False  # a Job's own token never launches Jobs (mado.authentication.RunTokenScope)

    @extend_schema(
        tags=TAGS,
        parameters=[_CHECKPOINT_ID, _IDEMPOTENCY_KEY],
        request=JobContinueInputSerializer,
        responses={
            201: JobDetailOutputSerializer,
            400: OpenApiResponse(
                description="bad field (named): dataset version ids (listed), code version "
                "of another Code, parameters, unknown or disabled queue"
            ),
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="checkpoint or code version not in the user's projects"),
            409: OpenApiResponse(description="the checkpoint is not complete (pending or deleted)"),
        },
    )
    def post(self, request, checkpoint_id):
        """Start a new Run and Job (kind ``continue``) from the checkpoint's weights with the chosen data: 201 the Job.

        Member or admin; the source Run may be in any state. The new Run
        inherits the kind, records parent Run and source checkpoint, and
        starts with ``input_dataset_version_ids``.
        """
        checkpoint = checkpoint_get_for_user(user=request.user, checkpoint_id=checkpoint_id)
        data = valid(JobContinueInputSerializer, request)
        job = services.run_continue_from_checkpoint(
            actor=request.user,
            checkpoint=checkpoint,
            code_version=_code_version(request.user, data["code_version_id"]),
            queue=selectors.queue_get(
                name=data["queue"]
                or selectors.continue_queue_name(source_job=selectors.job_for_run(run=checkpoint.run))
            ),
            parameters=data["parameters"],
            dataset_version_ids=data["input_dataset_version_ids"],
            name=data["name"],
            request_key=request.headers.get("Idempotency-Key"),
            nproc_per_node=data["nproc_per_node"],
        )
        return _job_response(request, job, status.HTTP_201_CREATED)


class QueueListApi(GenericAPIView):
    """``queues/``: the enabled execution targets."""

    @extend_schema(tags=TAGS, responses=QueueOutputSerializer(many=True))
    def get(self, request):
        """Enabled queues ``{name, description, runner, image}`` by name (paginated); any signed-in user."""
        page = self.paginate_queryset(selectors.queue_list())
        return self.get_paginated_response(QueueOutputSerializer(page, many=True).data)
