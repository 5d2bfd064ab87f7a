"""``sweeps/``: create and read Sweeps, claim a trial, report a trial's exit (docs/api.md "Sweeps";
docs/design/sweeps.md#sweeps, #requeue).

Thin (docs/design/house.md#views): the Sweep is fetched through ``sweep_get_for_user`` (another
Project's Sweep → 404) and one service decides (viewer → 403, bad config →
400 naming the field). A Run token (a Job's code) may not use these
endpoints: they create Runs.
"""

import math

from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from mado.api import valid
from runs import selectors as run_selectors
from runs.models import RunStatus
from sweeps import selectors, services
from sweeps.models import MetricGoal, SweepMethod, TrialState

TAGS = ["sweeps"]
_SWEEP_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="sweep id")


def _finite(value) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class SweepInputSerializer(serializers.Serializer):
    project = serializers.SlugField(max_length=100, help_text="project slug")
    config = serializers.JSONField(help_text="the sweep configuration: an object, or YAML / JSON text")


class SweepOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    project = serializers.CharField(source="project.slug", read_only=True, help_text="project slug")
    name = serializers.CharField(read_only=True)
    method = serializers.ChoiceField(choices=SweepMethod.choices, read_only=True)
    metric_name = serializers.CharField(read_only=True)
    metric_goal = serializers.ChoiceField(choices=MetricGoal.choices, read_only=True)
    parameters = serializers.JSONField(read_only=True, help_text="the normalised parameter space")
    program = serializers.ListField(child=serializers.CharField(), read_only=True, help_text="argv")
    run_cap = serializers.IntegerField(read_only=True, allow_null=True, help_text="most trials; null: no limit")
    config = serializers.JSONField(read_only=True, help_text="the configuration as submitted")
    created_by = serializers.CharField(source="created_by.username", read_only=True, help_text="username")
    created_at = serializers.DateTimeField(read_only=True)
    url = serializers.SerializerMethodField(help_text="absolute URL of the Sweep page")
    trial_counts = serializers.SerializerMethodField(help_text="trials per state: queued, leased, running, done, total")

    def get_url(self, sweep) -> str:
        return self.context["request"].build_absolute_uri(reverse("runs:sweep-detail", args=[sweep.pk]))

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_trial_counts(self, sweep):
        return selectors.trial_counts_of(sweep)


class SweepTrialOutputSerializer(serializers.Serializer):
    number = serializers.IntegerField(read_only=True)
    parameters = serializers.JSONField(read_only=True)
    state = serializers.ChoiceField(choices=TrialState.choices, read_only=True)
    requeue_count = serializers.IntegerField(read_only=True, help_text="how many times it was preempted and requeued")
    retry_count = serializers.IntegerField(read_only=True, help_text="how many times it was retried after failing")
    agent = serializers.CharField(read_only=True, help_text="host:pid of the agent holding or running it")
    lease_expires_at = serializers.DateTimeField(read_only=True, allow_null=True)
    run_id = serializers.IntegerField(read_only=True)
    external_id = serializers.CharField(source="run.external_id", read_only=True, help_text="the trial's run id")
    run_status = serializers.ChoiceField(source="run.status", choices=RunStatus.choices, read_only=True)
    metric = serializers.SerializerMethodField(help_text="last logged value of the sweep's metric (null: none)")

    def get_metric(self, trial) -> float | None:
        return _finite(getattr(trial, "metric", None))


class SweepDetailOutputSerializer(SweepOutputSerializer):
    trials = serializers.SerializerMethodField()
    best_trial = serializers.SerializerMethodField(help_text="number of the trial with the best metric (null: none)")

    @extend_schema_field(SweepTrialOutputSerializer(many=True))
    def get_trials(self, sweep):
        return SweepTrialOutputSerializer(self.context["trials"], many=True).data

    def get_best_trial(self, sweep) -> int | None:
        best = self.context["best"]
        return best.number if best else None


class SweepClaimInputSerializer(serializers.Serializer):
    agent = serializers.CharField(max_length=200, required=False, allow_blank=True, default="", help_text="host:pid")


class SweepCheckpointRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    step = serializers.IntegerField()


class SweepClaimedTrialOutputSerializer(serializers.Serializer):
    """The trial of a ``sweeps.services.SweepClaim`` with its Run's newest complete checkpoint."""

    number = serializers.IntegerField(source="trial.number")
    parameters = serializers.JSONField(source="trial.parameters")
    run_id = serializers.IntegerField(source="trial.run_id")
    external_id = serializers.CharField(source="trial.run.external_id", help_text="MMT_RUN_ID for the program")
    requeue_count = serializers.IntegerField(source="trial.requeue_count")
    lease_expires_at = serializers.DateTimeField(
        source="trial.lease_expires_at", help_text="the program must start the Run before this"
    )
    latest_checkpoint = SweepCheckpointRefSerializer(allow_null=True, help_text="resume from this (null: start fresh)")


class SweepClaimOutputSerializer(serializers.Serializer):
    """The claim's answer (the view builds it; this documents it in the schema)."""

    trial = SweepClaimedTrialOutputSerializer(allow_null=True, help_text="null: nothing to run now")
    program = serializers.ListField(child=serializers.CharField(), help_text="argv; append --name=value per parameter")
    project = serializers.CharField(help_text="project slug (MMT_PROJECT)")
    done = serializers.BooleanField(help_text="true: the sweep hands out nothing more; false with no trial: ask again")
    reason = serializers.CharField()


class SweepReportInputSerializer(serializers.Serializer):
    exit_code = serializers.IntegerField(help_text="the program's exit status (negative: killed by that signal)")
    preempted = serializers.BooleanField(required=False, default=False, help_text="a SIGTERM/SIGUSR1 was forwarded")
    agent = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text=(
            "host:pid of the reporting agent; a report from an agent that no longer holds the trial changes nothing"
        ),
    )


class SweepViewSet(GenericViewSet):
    """``sweeps/``, ``sweeps/{id}/``, ``sweeps/{id}/claim/``, ``sweeps/{id}/trials/{number}/report/`` and
    ``…/retry/``."""

    lookup_value_regex = "[0-9]+"
    run_token_allowed = False

    @extend_schema(
        tags=TAGS,
        responses=SweepOutputSerializer(many=True),
        parameters=[OpenApiParameter("project", str, description="project slug (404 unless a member)")],
    )
    def list(self, request):
        """Sweeps of the user's Projects, newest first (paginated); ``?project=`` filters."""
        slug = request.query_params.get("project")
        project = run_selectors.project_get_for_user(user=request.user, slug=slug) if slug else None
        page = self.paginate_queryset(selectors.sweep_list(user=request.user, project=project))
        return self.get_paginated_response(SweepOutputSerializer(page, many=True, context={"request": request}).data)

    @extend_schema(
        tags=TAGS,
        request=SweepInputSerializer,
        responses={
            201: SweepOutputSerializer,
            400: OpenApiResponse(description="bad config; names the field"),
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="not a member"),
        },
    )
    def create(self, request):
        """Create a Sweep in ``project`` from ``config`` (member or admin); 201 with the Sweep."""
        data = valid(SweepInputSerializer, request)
        project = run_selectors.project_get_for_user(user=request.user, slug=data["project"])
        sweep = services.sweep_create(actor=request.user, project=project, config=data["config"])
        sweep = selectors.sweep_get_for_user(user=request.user, sweep_id=sweep.pk)
        return Response(SweepOutputSerializer(sweep, context={"request": request}).data, status=status.HTTP_201_CREATED)

    @extend_schema(tags=TAGS, parameters=[_SWEEP_ID], responses=SweepDetailOutputSerializer)
    def retrieve(self, request, pk=None):
        """One Sweep with its trials (parameters, state, requeue count, Run, last metric value) and best trial."""
        sweep = selectors.sweep_get_for_user(user=request.user, sweep_id=pk)
        trials = selectors.sweep_trials(sweep=sweep)
        best = selectors.sweep_best_trial(sweep=sweep, trials=trials)
        context = {"request": request, "trials": trials, "best": best}
        return Response(SweepDetailOutputSerializer(sweep, context=context).data)

    @extend_schema(
        tags=TAGS,
        parameters=[_SWEEP_ID],
        request=SweepClaimInputSerializer,
        responses={200: SweepClaimOutputSerializer, 403: OpenApiResponse(description="viewer")},
    )
    @action(detail=True, methods=["post"])
    def claim(self, request, pk=None):
        """Claim the next trial: a queued one first (requeued after preemption or lease expired), else a new
        parameter set while the run cap allows; ``trial`` null when none is available now (see ``done``)."""
        sweep = selectors.sweep_get_for_user(user=request.user, sweep_id=pk)
        agent = valid(SweepClaimInputSerializer, request)["agent"]
        claim = services.sweep_claim(actor=request.user, sweep=sweep, agent=agent)
        trial = SweepClaimedTrialOutputSerializer(claim).data if claim.trial is not None else None
        body = {
            "trial": trial,
            "program": sweep.program,
            "project": sweep.project.slug,
            "done": claim.done,
            "reason": claim.reason,
        }
        return Response(body)

    @extend_schema(
        tags=TAGS,
        request=SweepReportInputSerializer,
        parameters=[_SWEEP_ID, OpenApiParameter("number", int, OpenApiParameter.PATH, description="trial number")],
        responses={200: SweepTrialOutputSerializer, 403: OpenApiResponse(description="viewer")},
    )
    @action(detail=True, methods=["post"], url_path=r"trials/(?P<number>[0-9]+)/report")
    def report(self, request, pk=None, number=None):
        """The agent's report after the trial's program exited: ends the Run if it has not ended (idempotent)."""
        sweep = selectors.sweep_get_for_user(user=request.user, sweep_id=pk)
        trial = selectors.sweep_trial_get(sweep=sweep, number=number)
        trial = services.sweep_trial_report(
            actor=request.user, trial=trial, **valid(SweepReportInputSerializer, request)
        )
        return Response(SweepTrialOutputSerializer(trial).data)

    @extend_schema(
        tags=TAGS,
        request=None,
        parameters=[_SWEEP_ID, OpenApiParameter("number", int, OpenApiParameter.PATH, description="trial number")],
        responses={
            200: SweepTrialOutputSerializer,
            403: OpenApiResponse(description="viewer"),
            404: OpenApiResponse(description="no such sweep or trial"),
            409: OpenApiResponse(description="the trial is not failed (or was already retried)"),
        },
    )
    @action(detail=True, methods=["post"], url_path=r"trials/(?P<number>[0-9]+)/retry")
    def retry(self, request, pk=None, number=None):
        """Retry a failed (crashed, aborted) trial: a fresh Run with its parameters, queued for the next agent's
        claim; the failed Run stays as history. Member or admin; 409 naming the trial's state when it
        is not failed, e.g. a second click after the first retry."""
        sweep = selectors.sweep_get_for_user(user=request.user, sweep_id=pk)
        trial = selectors.sweep_trial_get(sweep=sweep, number=number)
        return Response(SweepTrialOutputSerializer(services.sweep_trial_retry(actor=request.user, trial=trial)).data)
