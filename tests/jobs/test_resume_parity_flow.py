"""Resume you can prove, end to end on a real deployment (tests/deployment.py: gunicorn, a Celery worker running
``examples/training.py`` as Jobs) (docs/design/checkpoints.md#restore-check, #probe; docs/jobs.md, "Reading the
verdict").

The example fails at step 27 (checkpoints at 10 and 20) and is resumed from step 20, once as it is and once per
``--variant``: each resumed Job names, before its first step, what it did not restore (a WARNING line in the Job's
log, the Run's and the Job's ``restore_report``, ``mado job show``), and its parity verdict against the failed Run
says where the curves part. ``mado probe-resume`` exits 0 on the example and 1 on ``--variant reseed-rng``, naming
the RNG.

Needs the server's restore reports and parity verdicts (``POST runs/{id}/restore-report/``, ``restore_report``,
``resume_ignored_at_step`` and ``parity`` on the Run and Job resources).
"""

import re
import shlex
from contextlib import closing

import pytest

from tests.deployment import ROOT, deployment

EXAMPLE_ARGS = ["--steps", "30", "--checkpoint-every", "10"]
JOB_TIMEOUT_S = "300"
# variant, the parts its restore report names, the step where its curves part from the failed Run's
CASES = [
    (None, [], None),
    ("rebuild-scheduler", ["scheduler"], 21),
    ("reseed-rng", ["generator.batches", "rng.torch"], 20),
    ("restart-data", ["data_position"], 20),
    ("ignore-checkpoint", None, 20),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with deployment(tmp_path_factory.mktemp("parity")) as found:
        yield found


def push(site, name: str, *extra: str) -> str:
    """``examples/`` as a new version of Code ``name`` running the example with ``extra``; ``name:<version>``."""
    argv = ["python", "training.py", *EXAMPLE_ARGS, *extra]
    pushed = site.mado(
        "code", "push", ROOT / "examples", "--project", "flow", "--name", name, "--entrypoint", shlex.join(argv), "-q"
    )
    assert pushed.exit_code == 0, pushed.output
    return pushed.output.strip().splitlines()[-1]


def follow(site, job_id: int, exit_code: int) -> str:
    log = site.mado("job", "logs", job_id, "--follow", "--interval", "0.3", "--timeout", JOB_TIMEOUT_S)
    assert log.exit_code == exit_code, f"job {job_id}: {log.output}\n{site.logs()}"
    return log.output


def test_a_resumed_example_is_identical_and_each_broken_resume_names_its_part_and_where_it_parts(site):
    versions = {variant: push(site, "variants", *(["--variant", variant] if variant else [])) for variant, *_ in CASES}
    failing = push(site, "variants", "--fail-at-step", "27")
    launched = site.mado(
        "job", "launch", "--project", "flow", "--code-version", failing, "--queue", site.queue, "--name", "first", "-q"
    )
    assert launched.exit_code == 0, launched.output
    first = int(launched.output)
    follow(site, first, 3)
    with closing(site.client()) as client:
        checkpoint = client.request("GET", f"runs/{client.request('GET', f'jobs/{first}/')['run_id']}/checkpoints/")
        checkpoint_id = checkpoint["results"][0]["id"]
        for variant, parts, step in CASES:
            resumed = site.mado("job", "resume", first, "--latest", "--code-version", versions[variant], "-q")
            assert resumed.exit_code == 0, resumed.output
            job_id = int(resumed.output)
            log = follow(site, job_id, 0)
            job = client.request("GET", f"jobs/{job_id}/")
            run = client.request("GET", f"runs/{job['run_id']}/")
            shown = site.mado("job", "show", job_id).output
            assert run["restore_report"] == job["restore_report"] and run["parity"] == job["parity"], variant
            if variant is None:
                assert "WARNING" not in log
                assert run["restore_report"]["not_restored"] == [] and run["restore_report"]["checkpoint_id"]
                assert (run["parity"]["verdict"], run["parity"]["compared_steps"]) == ("identical", 7)
                assert "parity: identical over steps 20-26" in shown
                continue
            first_step = log.index(f"resuming from checkpoint {checkpoint_id} at step 20")
            if parts:
                warning = log.index(f"mado: WARNING: not restored from checkpoint {checkpoint_id} (step 20): ")
                assert all(re.search(rf"\b{re.escape(part)} — ", log[warning:]) for part in parts), log
                assert sorted(run["restore_report"]["not_restored"]) == parts
                assert run["restore_report"]["checkpoint_id"] == checkpoint_id
                assert f"not restored from the checkpoint: {', '.join(parts)}" in shown
            else:
                warning = log.index(f"resumes from checkpoint {checkpoint_id} (step 20) but loaded no checkpoint")
                assert run["restore_report"] is None
                assert run["resume_ignored_at_step"] == 20 and "resume ignored?" in shown
            assert first_step < warning < log.index("steps 20..30 in")
            assert (run["parity"]["verdict"], run["parity"]["step"]) == ("diverged", step), variant
            assert f"parity: diverged at step {step}: " in shown


def test_probe_resume_exits_0_on_the_example_and_1_naming_the_rng_on_a_re_seeding_variant(site):
    example, reseeding = push(site, "probe-example"), push(site, "probe-reseed", "--variant", "reseed-rng")
    arguments = ["--project", "flow", "--kill-at-step", "27", "--queue", site.queue, "--interval", "0.3"]
    exact = site.mado("probe-resume", "--code-version", example, *arguments, "--timeout", "600")
    assert exact.exit_code == 0, f"{exact.output}\n{site.logs()}"
    assert "restore report: every part of the checkpoint was restored" in exact.output
    assert "parity with the interrupted run: identical (7 steps, 2 keys)" in exact.output
    assert "against the uninterrupted run: identical (10 steps, 2 keys)" in exact.output
    broken = site.mado("probe-resume", "--code-version", reseeding, *arguments, "--timeout", "600")
    assert broken.exit_code == 1, f"{broken.output}\n{site.logs()}"
    assert re.search(r"not restored from the checkpoint: .*rng\.torch — re-seeded with 0 after load", broken.output)
    assert "parity with the interrupted run: diverged at step 20: " in broken.output
    assert "verdict: diverged" in broken.output
