"""API views for Runs and their metrics (docs/api.md; docs/design/resume.md#steps-continue;
docs/design/runs.md#resume-modes, #states).

The metrics endpoints are the hot path: the batch is parsed with ``orjson``
and checked by ``runs.metrics`` column by column, and history pages are built
as JSON text by the database (no per-point serializer), so 10,000 points
ingest and 100,000 points render in milliseconds.
"""

import json

import orjson
from django.conf import settings
from django.db.models import Prefetch
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param
from rest_framework.views import APIView
from rest_framework.viewsets import GenericViewSet

from mado.api import request_int, valid
from mado.db import read_statement_timeout
from mado.errors import NotFound, ValidationFailed
from runs import selectors, services
from runs.api.serializers import (
    FENCING_PARAMETER,
    MetricBatchInputSerializer,
    MetricBatchOutputSerializer,
    MetricHistoryOutputSerializer,
    MetricKeysOutputSerializer,
    RunInputSerializer,
    RunOutputSerializer,
    RunStatusInputSerializer,
)
from runs.history import SHAPES, metric_history_downsampled_json, metric_history_json
from runs.lease import fencing_token
from runs.metrics import metrics_ingest
from runs.models import DatasetVersion
from runs.resume import run_start

METRIC_PAGE_SIZE = 1000
METRIC_BODY_MAX = 64 * 1024 * 1024  # bytes; 10,000 points with 250-character keys fit many times over


_RUN_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="run id")


def _with_inputs(runs):
    return runs.prefetch_related(Prefetch("input_dataset_versions", queryset=DatasetVersion.objects.only("id")))


class RunViewSet(GenericViewSet):
    """``runs/`` and ``runs/{id}/``: create, list, read and change the status of Runs.

    A higher app that adds facts of its own to the Run resource subclasses this view with its own
    ``output_serializer`` (and the relations it reads in ``output_queryset``); ``config.api_urls`` routes to it.
    """

    lookup_value_regex = "[0-9]+"
    output_serializer = RunOutputSerializer

    def output_queryset(self, runs):
        """``runs`` with what ``output_serializer`` reads of each (a list page: no query per Run)."""
        return _with_inputs(runs)

    @extend_schema(
        tags=["runs"],
        parameters=[
            OpenApiParameter("project", str, description="project slug (404 unless a member)"),
            OpenApiParameter(
                "status",
                str,
                description="one of pending, running, finished, failed, aborted, crashed, preempting, preempted",
            ),
            OpenApiParameter("kind", str, description="training, fine_tuning, evaluation or other"),
            OpenApiParameter("external_id", str, description="the run id (unique per project; SDK resume)"),
        ],
        responses=RunOutputSerializer(many=True),
    )
    def list(self, request):
        """Runs of the user's Projects, newest first (paginated); ``?project=&status=&kind=&external_id=`` filter.

        An unknown ``status``/``kind`` → 400 naming it; a project the user is not in → 404.
        """
        slug = request.query_params.get("project")
        project = selectors.project_get_for_user(user=request.user, slug=slug) if slug else None
        runs = selectors.run_list(
            user=request.user,
            project=project,
            status=request.query_params.get("status"),
            kind=request.query_params.get("kind"),
            external_id=request.query_params.get("external_id"),
        )
        page = self.paginate_queryset(self.output_queryset(runs))
        return self.get_paginated_response(self.output_serializer(page, many=True, context={"request": request}).data)

    @extend_schema(
        tags=["runs"],
        request=RunInputSerializer,
        responses={
            201: RunOutputSerializer,
            200: OpenApiResponse(RunOutputSerializer, description="attached to a pending Run, or resumed"),
            400: OpenApiResponse(description="bad field (named): external_id, resume, host, pid..."),
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="resume=must: run <id> not found in project <slug>"),
            409: OpenApiResponse(
                description="external_id taken (never), run_live (another process "
                "heartbeats), or a changed parameters.<key>"
            ),
        },
    )
    def create(self, request):
        """Start a Run in ``project`` (slug) by the resume matrix (member or admin).

        Without ``external_id``: a new Run (201). With it, by ``resume``:
        ``must`` resumes that started Run (else 404), ``allow`` resumes it or
        creates it, ``never`` or absent create it (409 when it exists). A
        ``pending`` Run the caller created (a Job's or sweep trial's,
        ``MMT_RUN_ID``) is attached instead: 200, ``running``, stored fields
        unchanged. A resume (200, ``resumed`` true) continues the steps
        (``step_floor``), merges ``parameters`` and is refused with 409
        ``run_live`` while another process heartbeats. Every start answers a
        new ``fencing_token``.
        """
        data = dict(valid(RunInputSerializer, request))
        project = selectors.project_get_for_user(user=request.user, slug=data.pop("project"))
        started = run_start(actor=request.user, project=project, **data)
        context = {"request": request, "resumed": started.resumed, "last_step": started.last_step}
        return Response(
            self.output_serializer(started.run, context=context).data,
            status=status.HTTP_201_CREATED if started.created else status.HTTP_200_OK,
        )

    @extend_schema(tags=["runs"], responses=RunOutputSerializer, parameters=[_RUN_ID])
    def retrieve(self, request, pk=None):
        """One Run; 404 for another Project's Run."""
        run = selectors.run_get_for_user(user=request.user, run_id=pk)
        return Response(self.output_serializer(run, context={"request": request}).data)

    @extend_schema(
        tags=["runs"],
        request=RunStatusInputSerializer,
        parameters=[_RUN_ID],
        responses={
            200: RunOutputSerializer,
            403: OpenApiResponse(description="viewer"),
            409: OpenApiResponse(description="refused transition (ended, preempting) or lease_lost"),
        },
    )
    def partial_update(self, request, pk=None):
        """Set ``{status}``: running → preempting; preempting is sticky and ends finished or preempted.

        A final state is kept: the same one again is a no-op, running → 409
        ("only a resume restarts it"), another → 409. Fenced by ``Mado-Fencing-Token`` (stale → 409 lease_lost).
        """
        run = selectors.run_get_for_user(user=request.user, run_id=pk)
        asked = valid(RunStatusInputSerializer, request)["status"]
        run = services.run_set_status(actor=request.user, run=run, status=asked, fencing_token=fencing_token(request))
        return Response(self.output_serializer(run, context={"request": request}).data)


def _read_json_body(request):
    """The request body parsed as JSON, read without DRF's parsers (hot path); 400 naming ``body`` otherwise."""
    stream = request.stream
    raw = stream.read(METRIC_BODY_MAX + 1) if stream is not None else b""
    if len(raw) > METRIC_BODY_MAX:
        raise ValidationFailed(f"body larger than {METRIC_BODY_MAX} bytes; send smaller batches", field="body")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass  # orjson refuses integers beyond 64 bits: the stdlib parser reads them, for an error naming the point
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValidationFailed(f"body is not valid JSON: {exc}", field="body") from None


_GET_OUTPUT = PolymorphicProxySerializer(
    component_name="MetricGetOutput",
    serializers=[MetricKeysOutputSerializer, MetricHistoryOutputSerializer],
    resource_type_field_name=None,
)


class RunMetricsApi(APIView):
    """``runs/{id}/metrics/``: log a batch of points; list keys; read one key's history page by page."""

    @extend_schema(
        tags=["metrics"],
        request=MetricBatchInputSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key", str, OpenApiParameter.HEADER, description="one per batch, reused on its retries"
            ),
            FENCING_PARAMETER,
        ],
        responses={
            201: MetricBatchOutputSerializer,
            200: MetricBatchOutputSerializer,
            400: OpenApiResponse(description="bad point; names points[i].field"),
            403: OpenApiResponse(description="viewer"),
            409: OpenApiResponse(description="lease_lost: stale fencing token; run_ended: the Run was ended crashed"),
        },
    )
    def post(self, request, run_id):
        """Store ``{"points": [{key, value, step, timestamp?}, …]}`` or ``{"keys", "steps", "values", "timestamps"?}``.

        At most 10,000 points, all stored or none. The columnar form (four
        lists of one length; ``timestamps`` optional) is what the SDK sends.
        201 ``{"stored": n, "compared": c, "dropped": m, "dropped_keys": [...]}``: points at a
        step below the Run's ``step_floor`` (set by a resume) are not added to its series: they are kept as the
        resumed segment's own points and compared with the series (``compared``), or dropped and counted when
        the Run was resumed before segments were kept. ``value``: a number or ``"NaN"``/``"Infinity"``/``"-Infinity"``;
        ``step``: integer ≥ 0; ``timestamp``: Unix seconds (default: now).
        The first bad point → 400 naming ``points[i].field`` (``values[i]`` etc. in the columnar form), nothing
        stored. An ``Idempotency-Key`` header makes a repeated batch a no-op: 200 ``{"stored": 0, …}``.
        A stale ``Mado-Fencing-Token`` → 409 ``lease_lost``, nothing stored; a Run
        ended ``crashed`` → 409 ``run_ended``, nothing stored (only a resume revives it).
        """
        run = selectors.run_get_for_user(user=request.user, run_id=run_id, related=("project",))
        body = _read_json_body(request)
        if not isinstance(body, dict) or ("points" in body) == ("keys" in body):
            raise ValidationFailed(
                'body must be {"points": [...]} or {"keys": [...], "steps": [...], "values": [...]}', field="points"
            )
        batch = {"columns": body} if "keys" in body else {"points": body["points"]}
        result = metrics_ingest(
            actor=request.user,
            run=run,
            **batch,
            idempotency_key=request.headers.get("Idempotency-Key"),
            fencing_token=fencing_token(request),
        )
        answer = {
            "stored": result.stored,
            "compared": result.compared,
            "dropped": result.dropped,
            "dropped_keys": result.dropped_keys,
        }
        return Response(answer, status=status.HTTP_200_OK if result.replayed else status.HTTP_201_CREATED)

    @extend_schema(
        tags=["metrics"],
        parameters=[
            OpenApiParameter("key", str, description="metric key; without it the answer is {keys}"),
            OpenApiParameter("page", OpenApiTypes.INT, description="1-based page number"),
            OpenApiParameter("page_size", OpenApiTypes.INT, description="points per page (default 1000, max 100,000)"),
            OpenApiParameter(
                "max_points",
                OpenApiTypes.INT,
                description="at most this many points (>= 2), min and max per step bucket; no pages",
            ),
            OpenApiParameter(
                "shape",
                str,
                enum=list(SHAPES),
                description='with max_points: "columns" (default): results is '
                '{"steps": [...], "values": [...], "timestamps": [...]}; '
                '"points": a list of {step, value, timestamp} as pages have',
            ),
        ],
        responses={200: _GET_OUTPUT, 404: OpenApiResponse(description="run not visible or page past the end")},
    )
    def get(self, request, run_id):
        """Without ``key``: ``{"keys": [...]}``; with it: a page of that key's history.

        A page is ``{count, next, previous, results: [{step, value, timestamp}]}``.
        Points are ordered by step; ``timestamp`` is Unix seconds; non-finite
        values are the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
        ``page_size`` above the maximum is clamped; a page past the end → 404.
        ``max_points`` (2 to the page maximum) answers one downsampled series
        instead: ``results`` holds at most that many finite points (each step
        bucket's smallest and largest value), ``non_finite`` counts the NaN and
        ±Infinity left out; ``count`` is still every point of the key. Its
        ``results`` is one object of three arrays of one length, ``{"steps",
        "values", "timestamps"}`` (a chart's 2,000 points stay under
        100 KB), or with ``shape=points`` the pages' list of objects; another
        ``shape``, or ``shape=columns`` without ``max_points`` → 400 naming
        ``shape``. Reads stop after ``MADO_READ_STATEMENT_TIMEOUT_MS`` on PostgreSQL.
        """
        run = selectors.run_get_for_user(user=request.user, run_id=run_id, related=())  # reads need the Run alone
        key = request.query_params.get("key")
        with read_statement_timeout():
            if not key:
                return Response({"keys": selectors.metric_keys(run=run)})
            shape = request.query_params.get("shape") or ""
            if request.query_params.get("max_points") not in (None, ""):
                return self._downsampled(
                    run,
                    key,
                    request_int(request.query_params.get("max_points"), "max_points", default=2, minimum=1),
                    shape or "columns",
                )
            if shape not in ("", "points"):
                raise ValidationFailed("shape applies to a downsampled series: give max_points too", field="shape")
            size = min(
                request_int(request.query_params.get("page_size"), "page_size", default=METRIC_PAGE_SIZE, minimum=1),
                settings.MADO_METRIC_HISTORY_PAGE_MAX,
            )
            number = request_int(request.query_params.get("page"), "page", default=1, minimum=1)
            count = selectors.metric_count(run=run, key=key)
            if number > 1 and (number - 1) * size >= count:
                raise NotFound(f"page {number} is past the end ({count} points)", field="page")
            page = metric_history_json(run=run, key=key, offset=(number - 1) * size, limit=size)
        links = {
            "count": count,
            "next": self._page_url(request, number + 1) if number * size < count else None,
            "previous": self._page_url(request, number - 1) if number > 1 else None,
        }
        # The page is rendered as text in one pass (hot path: up to 100,000 points).
        return HttpResponse(json.dumps(links)[:-1] + ', "results": ' + page + "}", content_type="application/json")

    @staticmethod
    def _downsampled(run, key: str, max_points: int, shape: str) -> HttpResponse:
        if not 2 <= max_points <= settings.MADO_METRIC_HISTORY_PAGE_MAX:
            raise ValidationFailed(
                f"max_points must be from 2 to {settings.MADO_METRIC_HISTORY_PAGE_MAX}", field="max_points"
            )
        if shape not in SHAPES:
            raise ValidationFailed(f"shape must be one of {', '.join(SHAPES)}", field="shape")
        page, non_finite, count = metric_history_downsampled_json(run=run, key=key, max_points=max_points, shape=shape)
        head = json.dumps({"count": count, "non_finite": non_finite, "next": None, "previous": None})
        return HttpResponse(head[:-1] + ', "results": ' + page + "}", content_type="application/json")

    @staticmethod
    def _page_url(request, number: int) -> str:
        url = request.build_absolute_uri()
        return remove_query_param(url, "page") if number == 1 else replace_query_param(url, "page", number)
