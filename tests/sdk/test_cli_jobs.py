"""``mado code push`` and ``mado job launch | list | show | abort | resume | continue | logs`` against a live
server (docs/design/resume.md; docs/design/worker.md#subprocess). Celery's ``send_task`` is recorded, not sent: no
worker runs here (tests/jobs/test_job_flow.py drives the same commands with a real worker)."""

import threading
import time
from types import SimpleNamespace

import pytest
from celery import current_app
from click.testing import CliRunner
from django.db import connection

from checkpoints.models import Checkpoint, CheckpointState
from jobs import services
from jobs.models import Job, JobKind, JobStatus, Queue
from mado_tracking.cli import main
from runs.models import Role, Run
from runs.stages import data_stage_record
from tests.factories import CodeVersionFactory, DatasetFactory, DatasetVersionFactory, MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    """Every ``send_task`` (the dispatch on commit) recorded instead of reaching a broker."""
    calls = []

    def send_task(name, args=None, kwargs=None, **options):
        calls.append({"name": name, "args": args, **options})
        return SimpleNamespace(id=options.get("task_id"))

    monkeypatch.setattr(current_app, "send_task", send_task)
    monkeypatch.setattr(current_app.control, "revoke", lambda task_id, **kw: None)
    return calls


@pytest.fixture(autouse=True)
def _no_persistent_connections(monkeypatch, db):
    """The live server's request threads close their connection after each request (PostgreSQL's
    ``CONN_MAX_AGE`` would keep one open, e.g. after a refused command, and block dropping the test database)."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)


@pytest.fixture
def cpu(db):
    # a transactional test's flush removes the row the data migration created
    return Queue.objects.get_or_create(name="cpu")[0]


@pytest.fixture
def mado(live_server, token_of):
    """``mado(*args, user=…)``: the command line as ``user`` against the live server (exceptions propagate)."""

    def invoke(*args, user, input=None):
        env = {"MMT_API_URL": live_server.url, "MMT_API_TOKEN": token_of(user), "MMT_PROJECT": None}
        return CliRunner().invoke(main, [str(arg) for arg in args], env=env, input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def code_version(project, creator):
    return CodeVersionFactory(code__project=project, code__created_by=creator, code__name="trainer", version=1)


def _failed_job(actor, code_version, queue, *, steps=(10, 20)) -> tuple[Job, dict[int, Checkpoint]]:
    job = services.job_launch(
        actor=actor,
        code_version=code_version,
        queue=queue,
        parameters={"lr": 0.1},
        dataset_version_ids=[],
        name="baseline",
    )
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    job = services.job_finish(job_id=job.pk, exit_code=1)
    checkpoints = {
        step: Checkpoint.objects.create(
            run=job.run, step=step, state=CheckpointState.COMPLETE, file_count=1, total_bytes=10
        )
        for step in steps
    }
    return job, checkpoints


# --- job launch / list / show ----------------------------------------------------------------------


def test_job_launch_creates_the_run_and_sends_the_job_to_its_queue(mado, creator, project, code_version, cpu, sent):
    gpu = Queue.objects.create(name="gpu-a100")
    dataset = DatasetFactory(project=project, name="digits")
    data_version = DatasetVersionFactory(dataset=dataset, version="v1")
    result = mado(
        "job",
        "launch",
        "--project",
        "vision",
        "--code-version",
        "trainer:1",
        "--param",
        "lr=0.05",
        "--param",
        "optimizer=adam",
        "--param",
        "layers=[64, 32]",
        "--param",
        "note=",
        "--dataset-version",
        data_version.pk,
        "--queue",
        "gpu-a100",
        "--max-retries",
        "2",
        "--name",
        "wide",
        user=creator,
    )
    assert result.exit_code == 0, result.output
    job = Job.objects.select_related("run").get()
    assert (job.queue, job.max_retries, job.kind, job.status) == (gpu, 2, JobKind.NEW, JobStatus.QUEUED)
    assert job.run.parameters == {"lr": 0.05, "optimizer": "adam", "layers": [64, 32], "note": ""}
    assert list(job.run.input_dataset_versions.all()) == [data_version] and job.run.name == "wide"
    assert result.output.splitlines()[0] == (
        f"job {job.pk} queued on gpu-a100: run {job.run_id} ({job.run.external_id}) in project vision"
    )
    assert result.output.splitlines()[1].endswith(f"/runs/{job.run_id}/")
    assert [(call["name"], call["args"], call["queue"]) for call in sent] == [
        ("worker.tasks.run_job", [job.pk], "gpu-a100")
    ]

    by_id = mado("job", "launch", "--code-version", code_version.pk, "-q", user=creator)
    assert by_id.exit_code == 0, by_id.output
    assert by_id.output == f"{Job.objects.latest('pk').pk}\n" and Job.objects.latest("pk").queue == cpu


def test_job_launch_names_the_refused_field(mado, creator, project, code_version, cpu, other_project, outsider, sent):
    unknown = mado("job", "launch", "--code-version", code_version.pk, "--queue", "nope", user=creator)
    assert unknown.exit_code == 1
    assert unknown.output.startswith("Error: cannot launch the job: ")
    assert "(field queue; HTTP 400 invalid)" in unknown.output

    elsewhere = CodeVersionFactory(code__project=other_project, code__created_by=outsider, code__name="theirs")
    hidden = mado("job", "launch", "--code-version", elsewhere.pk, user=creator)
    assert hidden.exit_code == 1 and "HTTP 404" in hidden.output
    MembershipFactory(user=creator, project=other_project, role=Role.MEMBER)
    wrong_project = mado("job", "launch", "--project", "vision", "--code-version", elsewhere.pk, user=creator)
    assert wrong_project.exit_code == 1
    assert f"code version {elsewhere.pk} is not a version of a Code of project 'vision'" in wrong_project.output
    missing = mado("job", "launch", "--project", "vision", "--code-version", "trainer:7", user=creator)
    assert missing.exit_code == 1 and "Code 'trainer' has no version 7" in missing.output
    no_code = mado("job", "launch", "--project", "vision", "--code-version", "ghost", user=creator)
    assert no_code.exit_code == 1 and "project 'vision' has no Code named 'ghost'" in no_code.output
    bad_param = mado("job", "launch", "--code-version", code_version.pk, "--param", "lr", user=creator)
    assert bad_param.exit_code == 2 and "'lr': use KEY=VALUE" in bad_param.output
    assert not Job.objects.exists() and sent == []


def test_job_launch_and_resume_take_processes_per_node(mado, creator, project, code_version, cpu):
    launched = mado("job", "launch", "--code-version", code_version.pk, "--nproc-per-node", "2", "-q", user=creator)
    assert launched.exit_code == 0, launched.output
    assert Job.objects.get(pk=int(launched.output)).nproc_per_node == 2
    assert "processes per node: 2" in mado("job", "show", int(launched.output), user=creator).output
    refused = mado("job", "launch", "--code-version", code_version.pk, "--nproc-per-node", "0", user=creator)
    assert refused.exit_code == 2 and "--nproc-per-node" in refused.output
    failed, _ = _failed_job(creator, code_version, cpu)
    resumed = mado("job", "resume", failed.pk, "--latest", "--nproc-per-node", "3", "-q", user=creator)
    assert resumed.exit_code == 0, resumed.output
    assert Job.objects.get(pk=int(resumed.output)).nproc_per_node == 3


def test_job_list_and_show(mado, creator, member, project, code_version, cpu):
    failed, _ = _failed_job(creator, code_version, cpu)
    resumed = services.job_resume_from_latest(actor=creator, job=failed)
    listed = mado("job", "list", "--project", "vision", user=member)
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.output.strip().splitlines()
    assert header.split()[:5] == ["ID", "STATUS", "KIND", "QUEUE", "RUN"]
    assert [row.split()[:4] for row in rows] == [
        [str(resumed.pk), "queued", "resume", "cpu"],
        [str(failed.pk), "failed", "new", "cpu"],
    ]
    assert all("trainer:1" in row.split() for row in rows)  # CODE as --code-version takes it back
    assert mado("job", "list", "--status", "succeeded", user=member).output.strip() == "no jobs"

    shown = mado("job", "show", failed.pk, user=member)
    assert shown.exit_code == 0, shown.output
    assert f"job {failed.pk} failed on cpu: run {failed.run_id}" in shown.output
    assert "error: The code exited with code 1." in shown.output
    # the reason shown in place of the button (docs/design/resume.md#who-may-resume)
    assert "resume: This is not your run" in shown.output
    resumed_line = mado("job", "show", resumed.pk, user=creator).output.splitlines()[0]
    assert resumed_line.endswith(
        f", resume of run {failed.run_id} from checkpoint {resumed.run.source_checkpoint_id} (step 20)"
    )


# --- abort / resume --------------------------------------------------------------------------------


def test_job_abort_by_its_creator_and_refused_to_another_member(mado, creator, member, project, code_version, cpu):
    job = services.job_launch(
        actor=creator, code_version=code_version, queue=cpu, parameters={}, dataset_version_ids=[]
    )
    refused = mado("job", "abort", job.pk, user=member)
    assert refused.exit_code == 1
    assert f"cannot abort job {job.pk}: This is not your run" in refused.output and "HTTP 403" in refused.output
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED

    done = mado("job", "abort", job.pk, user=creator)
    assert done.exit_code == 0, done.output
    assert done.output == f"job {job.pk} aborted\n"
    job.refresh_from_db()
    assert job.status == JobStatus.ABORTED

    services.job_claim(
        job_id=(
            running := services.job_launch(
                actor=creator, code_version=code_version, queue=cpu, parameters={}, dataset_version_ids=[]
            )
        ).pk,
        worker_host="gpu-1",
    )
    requested = mado("job", "abort", running.pk, user=creator)
    assert requested.exit_code == 0 and "abort requested" in requested.output
    assert Job.objects.get(pk=running.pk).abort_requested_at is not None


def test_job_resume_latest_then_from_a_chosen_checkpoint(mado, creator, project, code_version, cpu, sent):
    failed, checkpoints = _failed_job(creator, code_version, cpu)
    newer = CodeVersionFactory(code=code_version.code, version=2)
    latest = mado("job", "resume", failed.pk, "--latest", "--code-version", "trainer:2", user=creator)
    assert latest.exit_code == 0, latest.output
    resumed = Job.objects.select_related("run").latest("pk")
    assert (resumed.kind, resumed.resumed_from_id, resumed.code_version_id) == (JobKind.RESUME, failed.run_id, newer.pk)
    assert (resumed.run.parent_id, resumed.run.source_checkpoint_id) == (failed.run_id, checkpoints[20].pk)
    assert latest.output.splitlines()[0] == (
        f"job {resumed.pk} queued on cpu: run {resumed.run_id} ({resumed.run.external_id}) in project vision, "
        f"resume of run {failed.run_id} from checkpoint {checkpoints[20].pk} (step 20)"
    )
    assert sent[-1]["args"] == [resumed.pk]

    twice = mado("job", "resume", failed.pk, "--latest", user=creator)
    assert twice.exit_code == 1
    assert f"is already being resumed by Job {resumed.pk}" in twice.output and "HTTP 409 conflict" in twice.output

    services.job_abort(actor=creator, job=resumed)
    chosen = mado("job", "resume", failed.pk, "--checkpoint", checkpoints[10].pk, "-q", user=creator)
    assert chosen.exit_code == 0, chosen.output
    again = Job.objects.select_related("run").get(pk=int(chosen.output))
    assert (again.run.source_checkpoint_id, again.code_version_id) == (checkpoints[10].pk, code_version.pk)
    failed.run.refresh_from_db()
    assert failed.run.status == "failed"  # the source Run is never changed (docs/design/resume.md#lineage)


def test_job_resume_refusals(mado, creator, member, project, code_version, cpu):
    failed, checkpoints = _failed_job(creator, code_version, cpu)
    other, other_checkpoints = _failed_job(creator, code_version, cpu, steps=(5,))
    for flags in ([], ["--latest", "--checkpoint", checkpoints[10].pk]):
        usage = mado("job", "resume", failed.pk, *flags, user=creator)
        assert usage.exit_code == 2 and "give either --latest or --checkpoint ID" in usage.output
    foreign = mado("job", "resume", failed.pk, "--checkpoint", other_checkpoints[5].pk, user=creator)
    assert foreign.exit_code == 1
    assert (
        f"checkpoint {other_checkpoints[5].pk} belongs to run {other.run_id}, not to run {failed.run_id}"
        in foreign.output
    )
    not_yours = mado("job", "resume", failed.pk, "--latest", user=member)
    assert not_yours.exit_code == 1 and "This is not your run" in not_yours.output and "HTTP 403" in not_yours.output
    running = services.job_launch(
        actor=creator, code_version=code_version, queue=cpu, parameters={}, dataset_version_ids=[]
    )
    services.job_claim(job_id=running.pk, worker_host="gpu-1")
    busy = mado("job", "resume", running.pk, "--latest", user=creator)
    assert busy.exit_code == 1 and "HTTP 409" in busy.output
    assert Job.objects.filter(kind=JobKind.RESUME).count() == 0


def _finished_job_with_data(actor, code_version, queue, project):
    """A succeeded Job trained on ``digits:v1`` then, from step 15, ``digits:v1`` + ``labels:v1``; a checkpoint at
    20."""
    first = DatasetVersionFactory(dataset=DatasetFactory(project=project, name="digits"), version="v1")
    second = DatasetVersionFactory(dataset=DatasetFactory(project=project, name="labels"), version="v1")
    job = services.job_launch(
        actor=actor,
        code_version=code_version,
        queue=queue,
        parameters={"lr": 0.1, "depth": 4},
        dataset_version_ids=[first.pk],
        name="baseline",
    )
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    data_stage_record(actor=actor, run=job.run, start_step=15, dataset_version_ids=[first.pk, second.pk])
    job = services.job_finish(job_id=job.pk, exit_code=0)
    checkpoint = Checkpoint.objects.create(
        run=job.run, step=20, state=CheckpointState.COMPLETE, file_count=1, total_bytes=10
    )
    return job, checkpoint, first, second


def test_job_continue_from_a_finished_run_keeps_its_data_at_the_step_and_adds_new_data(
    mado, creator, project, code_version, cpu, sent
):
    gpu = Queue.objects.get_or_create(name="gpu")[0]
    finished, checkpoint, first, second = _finished_job_with_data(creator, code_version, gpu, project)
    added = DatasetVersionFactory(dataset=DatasetFactory(project=project, name="fresh"), version="v1")
    result = mado(
        "job",
        "continue",
        checkpoint.pk,
        "--add-dataset-version",
        added.pk,
        "--param",
        "lr=0.01",
        "--name",
        "more data",
        user=creator,
    )
    assert result.exit_code == 0, result.output
    job = Job.objects.select_related("run").latest("pk")
    assert (job.kind, job.code_version_id, job.run.parent_id, job.run.source_checkpoint_id, job.queue) == (
        JobKind.CONTINUE,
        code_version.pk,
        finished.run_id,
        checkpoint.pk,
        gpu,
    )  # the source Job's queue
    assert sorted(job.run.input_dataset_versions.values_list("pk", flat=True)) == sorted(
        [first.pk, second.pk, added.pk]
    )  # the composition at step 20 (the stage from 15 on) + the new set
    assert job.run.parameters == {"lr": 0.01, "depth": 4} and job.run.name == "more data"
    assert result.output.splitlines()[0] == (
        f"job {job.pk} queued on gpu: run {job.run_id} ({job.run.external_id}) in project vision, "
        f"continue of run {finished.run_id} from checkpoint {checkpoint.pk} (step 20)"
    )
    assert sent[-1]["args"] == [job.pk]
    finished.run.refresh_from_db()
    assert finished.run.status == "finished"  # only read

    same = mado("job", "continue", checkpoint.pk, "--dataset-version", first.pk, "--queue", "cpu", "-q", user=creator)
    assert same.exit_code == 0, same.output
    again = Job.objects.select_related("run").get(pk=int(same.output))
    assert again.queue == cpu
    assert list(again.run.input_dataset_versions.values_list("pk", flat=True)) == [first.pk]
    assert again.run.parameters == {"lr": 0.1, "depth": 4}  # no --param: the source Run's


def test_job_continue_refusals(mado, creator, viewer, project, code_version, cpu):
    finished, checkpoint, _, _ = _finished_job_with_data(creator, code_version, cpu, project)
    watcher = mado("job", "continue", checkpoint.pk, user=viewer)
    assert watcher.exit_code == 1 and "HTTP 403" in watcher.output
    pending = Checkpoint.objects.create(run=finished.run, step=30, state=CheckpointState.PENDING)
    waiting = mado("job", "continue", pending.pk, user=creator)
    assert waiting.exit_code == 1 and "HTTP 409" in waiting.output
    other = CodeVersionFactory(code__project=project, code__created_by=creator, code__name="other", version=1)
    foreign = mado("job", "continue", checkpoint.pk, "--code-version", other.pk, user=creator)
    assert foreign.exit_code == 1 and "code_version_id" in foreign.output
    Run.objects.filter(pk=finished.run_id).update(code_version=None)
    unnamed = mado("job", "continue", checkpoint.pk, user=creator)
    assert unnamed.exit_code == 2 and "ran no registered Code: give --code-version" in unnamed.output
    assert not Job.objects.filter(kind=JobKind.CONTINUE).exists()


def test_checkpoint_list_prints_the_ids_that_resume_and_continue_take(mado, creator, viewer, code_version, cpu):
    failed, checkpoints = _failed_job(creator, code_version, cpu)
    listed = mado("checkpoint", "list", failed.run_id, user=viewer)
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.output.strip().splitlines()
    assert header.split() == ["ID", "STEP", "STATE", "FILES", "MB", "FRAMEWORK", "OPTIMIZER", "CREATED"]
    assert [row.split()[:3] for row in rows] == [
        [str(checkpoints[20].pk), "20", "complete"],
        [str(checkpoints[10].pk), "10", "complete"],
    ]
    other = mado("checkpoint", "list", failed.run_id + 1000, user=viewer)
    assert other.exit_code == 1 and "HTTP 404" in other.output


# --- logs ------------------------------------------------------------------------------------------


def test_job_logs_prints_the_output_and_follows_it_until_the_job_ends(mado, creator, project, code_version, cpu):
    job = services.job_launch(
        actor=creator, code_version=code_version, queue=cpu, parameters={}, dataset_version_ids=[]
    )
    services.job_claim(job_id=job.pk, worker_host="gpu-1")
    services.job_append_log(job_id=job.pk, text="step 0\nstep 1\n")
    now = mado("job", "logs", job.pk, user=creator)
    assert (now.exit_code, now.output) == (0, "step 0\nstep 1\n")
    waited = mado("job", "logs", job.pk, "--follow", "--interval", "0.05", "--timeout", "0.3", user=creator)
    assert waited.exit_code == 4 and waited.output.endswith(f"job {job.pk} is still running after 0.3 s\n")

    def worker():
        try:
            time.sleep(0.5)
            services.job_append_log(job_id=job.pk, text="step 2\n")
            time.sleep(0.3)
            services.job_append_log(job_id=job.pk, text="done\n")
            services.job_finish(job_id=job.pk, exit_code=0)
        finally:
            connection.close()  # this thread's own, which would block dropping the test database

    thread = threading.Thread(target=worker)
    thread.start()
    followed = mado("job", "logs", job.pk, "-f", "--interval", "0.05", "--timeout", "60", user=creator)
    thread.join()
    assert followed.exit_code == 0, followed.output
    assert followed.output == f"step 0\nstep 1\nstep 2\ndone\njob {job.pk} succeeded, exit code 0\n"


def test_job_logs_follow_exits_3_for_a_failed_job(mado, creator, member, project, code_version, cpu, outsider):
    failed, _ = _failed_job(creator, code_version, cpu)
    result = mado("job", "logs", failed.pk, "--follow", user=member)
    assert result.exit_code == 3
    assert result.output.endswith(f"job {failed.pk} failed, exit code 1: The code exited with code 1.\n")
    hidden = mado("job", "logs", failed.pk, user=outsider)
    assert hidden.exit_code == 1 and "HTTP 404" in hidden.output and "Traceback" not in hidden.output
