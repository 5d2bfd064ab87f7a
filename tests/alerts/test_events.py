"""Every run event reaches the rules that watch it, through the events the lower apps send
(docs/design/alerts.md#rules): a member's personal subscription is mailed to them."""

import pytest
from celery import current_app
from django.core import mail

from alerts.models import Event, Firing
from alerts.services.rules import rule_create
from checkpoints.models import Checkpoint
from checkpoints.services.janitor import checkpoint_end_in_error
from checkpoints.services.scrub import checkpoint_scrub_pass
from jobs.models import Queue
from jobs.services.lifecycle import job_fail_undelivered
from runs.models import RunStatus
from runs.resume import run_start
from tests.checkpoints.checkpoint_helpers import save
from tests.checkpoints.test_scrub import alter_stored_tar
from tests.factories import CodeVersionFactory, RunFactory
from tests.jobs.conftest import checkpoint, launch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def subscribed(eager, project, creator):
    creator.email = "carol@example.org"
    creator.save()

    def subscribe(event, **fields):
        return rule_create(actor=creator, project=project, name=event, event=event, personal=True, **fields)

    return subscribe


def subjects():
    return [message.subject for message in mail.outbox]


def test_a_checkpoint_left_unfinished_mails_the_subscriber(subscribed, project, creator):
    subscribed(Event.CHECKPOINT_REFUSED)
    run = RunFactory(project=project, created_by=creator, name="ckpt-run")
    pending = checkpoint(run, 40, state="pending")

    assert checkpoint_end_in_error(checkpoint_id=pending.pk, error="The upload was not finished within its lease.")

    assert subjects() == ["[mado] Checkpoint at step 40 of run ckpt-run refused"]
    assert "not finished within its lease" in mail.outbox[0].body


def test_a_stored_checkpoint_a_scrub_finds_corrupt_mails_the_subscriber_once(subscribed, api, project, creator):
    subscribed(Event.CHECKPOINT_CORRUPT)
    run = RunFactory(project=project, created_by=creator, name="ckpt-run")
    saved = Checkpoint.objects.get(pk=save(api(creator), run, 7)["id"])
    alter_stored_tar(saved)

    assert checkpoint_scrub_pass(rate=10**12).corrupt == [saved.pk]
    checkpoint_scrub_pass(rate=10**12)  # the next pass: already corrupt, nothing more

    assert subjects() == ["[mado] Stored checkpoint at step 7 of run ckpt-run is corrupt"]
    assert "the stored object's SHA-256 is" in mail.outbox[0].body
    assert "no longer offered for resume" in mail.outbox[0].body


def test_a_job_no_worker_took_mails_the_subscriber(subscribed, monkeypatch, project, creator):
    subscribed(Event.JOB_GIVEN_UP)
    queue = Queue.objects.get_or_create(name="gpu-h100")[0]
    code_version = CodeVersionFactory(code__project=project, code__created_by=creator, version=1)
    monkeypatch.setitem(current_app.conf, "task_always_eager", False)  # the Job's message waits in the broker
    job = launch(creator, code_version, queue, name="never-ran")
    monkeypatch.setitem(current_app.conf, "task_always_eager", True)

    job_fail_undelivered([job.pk], "No worker took it from queue 'gpu-h100'.")

    assert subjects() == ["[mado] Job of run never-ran given up"]


def test_a_resumed_run_fires_once_per_resume_and_a_finished_one_too(subscribed, project, creator):
    subscribed(Event.RESUMED)
    subscribed(Event.FINISHED)
    run = RunFactory(project=project, created_by=creator, name="again", status=RunStatus.CRASHED)

    run_start(actor=creator, project=project, external_id=run.external_id, resume="allow")

    assert subjects() == ["[mado] Run again resumed"]
    assert Firing.objects.get().condition == "resumed #1"


def test_filters_keep_a_rule_to_its_runs(subscribed, project, creator, member):
    subscribed(Event.CRASHED, kinds=["training"], creators=[member.username])
    run = RunFactory(project=project, created_by=creator, name="not-mike", status=RunStatus.RUNNING)
    from runs.liveness import run_ended_effects

    run.status = RunStatus.CRASHED
    run_ended_effects(run=run)

    assert subjects() == [] and not Firing.objects.exists()


def test_a_quiet_period_records_but_does_not_send_a_second_firing(subscribed, project, creator):
    subscribed(Event.CRASHED, quiet_minutes=30)
    from runs.liveness import run_ended_effects

    for name in ("first", "second"):
        run = RunFactory(project=project, created_by=creator, name=name, status=RunStatus.CRASHED)
        run_ended_effects(run=run)

    assert subjects() == ["[mado] Run first crashed"]
    assert list(Firing.objects.order_by("pk").values_list("quieted", flat=True)) == [False, True]


def test_tag_and_queue_filters_match_the_runs_tags_and_jobs_queue(project, creator):
    from alerts.models import Rule
    from alerts.services.firing import rule_matches
    from runs.models import RunTag
    from tests.alerts.history import T0, _run

    queue = Queue.objects.get_or_create(name="gpu-a100")[0]
    code_version = CodeVersionFactory(code__project=project, code__created_by=creator, version=1)
    on_a100 = _run(project, creator, "big", RunStatus.CRASHED, T0, 1, queue=queue, gpus=8, code_version=code_version)
    RunTag.objects.create(run=on_a100, key="team", value="vision")
    loose = RunFactory(project=project, created_by=creator, name="loose")

    def rule(**filters):
        return Rule(project=project, name="r", event=Event.CRASHED, created_by=creator, **filters)

    assert rule_matches(rule(queues=["gpu-a100"]), on_a100) and not rule_matches(rule(queues=["gpu-a100"]), loose)
    assert rule_matches(rule(tags=["team=vision"]), on_a100) and rule_matches(rule(tags=["team"]), on_a100)
    assert not rule_matches(rule(tags=["team=nlp"]), on_a100) and not rule_matches(rule(tags=["team"]), loose)
