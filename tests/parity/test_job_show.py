"""``mado job show`` on a resumed Job: the parts not restored, the "resume ignored?" line, the parity verdict and the
changes made on purpose (docs/design/resume.md#restore-report, #parity, #declared-changes), read from the Job resource
of a live server."""

import pytest
from click.testing import CliRunner

from mado_tracking.cli import main
from parity.services import restore_report_record
from tests.factories import api_key
from tests.jobs.conftest import (  # noqa: F401
    celery_calls,
    checkpoint,
    code_version,
    cpu,
    dataset_versions,
    failed_job,
)
from tests.parity.conftest import curve
from tests.parity.test_api import resumed_job  # noqa: F401
from tests.parity.test_declared import LOGGED, OVERRIDDEN_REPORT, continued, trained_at  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def job_show(live_server, user, job_id) -> str:
    env = {"MMT_API_URL": live_server.url, "MMT_API_TOKEN": api_key(user)}
    shown = CliRunner().invoke(main, ["job", "show", str(job_id)], env=env, catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    return shown.output


def test_job_show_names_what_was_not_restored_and_where_the_runs_part(
    live_server, creator, log, failed_job, resumed_job
):
    assert "  parity: unknown (no step logged by both runs from the checkpoint's step 20 on)" in job_show(
        live_server, creator, resumed_job.pk
    )
    log(failed_job.run, range(27))
    log(resumed_job.run, range(0, 30), value=lambda key, step: curve(key, step) + (0.5 if step >= 21 else 0))
    restore_report_record(
        actor=creator,
        run=resumed_job.run,
        body={
            "parts": {"model": "restored", "rng.torch": "not_restored", "data_position": "not_declared"},
            "details": {"rng.torch": "re-seeded", "data_position": "declare it with save_checkpoint(data_position=)"},
        },
    )
    lines = job_show(live_server, creator, resumed_job.pk).splitlines()
    parent = curve("train.accuracy", 21)
    assert lines[-7:-1] == [
        "  not restored from the checkpoint: rng.torch",
        "    rng.torch: re-seeded",
        "  not declared in the checkpoint, so not checked: data_position",
        "    data_position: declare it with save_checkpoint(data_position=)",
        "  resume ignored?: the first logged step 0 lies below the checkpoint's step 20",
        f"  parity: diverged at step 21: train.accuracy {parent!r} in the parent run, {parent + 0.5!r} here",
    ]


def test_job_show_says_a_checkpoint_holding_a_training_state_was_not_loaded(
    live_server, creator, log, failed_job, resumed_job
):
    from checkpoints.models import Checkpoint
    from tests.parity.test_api import TRAINING_STATE

    source = resumed_job.run.source_checkpoint_id
    Checkpoint.objects.filter(pk=source).update(metadata={"training_state": TRAINING_STATE})
    log(failed_job.run, range(27))
    log(resumed_job.run, range(20, 30))
    assert (
        f"  resume ignored?: checkpoint {source} (step 20) holds a training state but the run sent no restore report "
        "before its first metrics (step 20): it did not load the checkpoint through mado_tracking"
    ) in job_show(live_server, creator, resumed_job.pk)


@pytest.mark.parametrize(
    ("report", "lr_from", "loss_from", "expected"),
    [
        (
            None,
            21,
            22,
            [
                "  parity: changed on purpose from step 21: train.lr 0.1 in the parent run, 0.02 here",
                "    changed on purpose: lr 0.1 → 0.02 (took effect at step 21)",
            ],
        ),
        (
            OVERRIDDEN_REPORT,
            99,
            21,
            [
                f"  parity: diverged at step 21: train.accuracy {curve('train.accuracy', 21)!r} in the parent run, "
                f"{curve('train.accuracy', 21) + 0.25!r} here",
                "    changed on purpose: lr 0.1 → 0.02 — but the optimizer still ran at 0.1 (the restored scheduler "
                "overrode it)",
            ],
        ),
    ],
)
def test_job_show_names_the_changes_made_on_purpose_and_whether_each_took_effect(
    live_server, creator, log, continued, report, lr_from, loss_from, expected
):
    if report:
        restore_report_record(actor=creator, run=continued, body=report)
    log(continued, range(20, 30), keys=LOGGED, value=trained_at(lr_from=lr_from, loss_from=loss_from))
    lines = job_show(live_server, creator, continued.job.pk).splitlines()
    start = lines.index(expected[0])  # the verdict, then each change under it
    assert sorted(lines[start + 1 : start + 3]) == [
        "    changed on purpose: epochs null → 3 (not seen in the logged metrics or the restore report: whether it "
        "took effect is not known)",
        expected[1],
    ]
