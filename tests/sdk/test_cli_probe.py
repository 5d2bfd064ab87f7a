"""``mado probe-resume`` against a stand-in for the Jobs API: three Jobs launched and resumed as it should, the
restore report and both verdicts printed, the exit status from the verdicts (docs/design/checkpoints.md#probe).
The real flow, with a worker running the example and its variants: tests/jobs/test_resume_parity_flow.py."""

import threading
from urllib.parse import parse_qs, urlparse

import pytest
from click.testing import CliRunner

from mado_tracking.cli import main
from tests.sdk.stub_api import HttpStub, JsonHandler

LOSS = {step: 1.0 / (step + 1) for step in range(30)}
IDENTICAL = {
    "verdict": "identical",
    "step": None,
    "key": None,
    "parent_value": None,
    "child_value": None,
    "tolerance": 1e-6,
    "compared_steps": 7,
    "compared_keys": ["train.loss"],
}
ALL_RESTORED = {"checkpoint_id": 9, "not_restored": [], "details": {}, "reported_at": "2025-01-01T00:00:00Z"}


class ProbeStub(HttpStub):
    """Jobs: the one with ``mado_probe_fail_at_step`` ends ``stopped_status``, the others ``succeeded`` (or stay
    ``running`` when ``hang``); the resumed Run answers ``run_extra`` and logs ``resumed_loss`` from step 20."""

    def __init__(self, *, run_extra=None, resumed_loss=None, stopped_status="failed", hang=False):
        self.jobs, self.run_extra, self.hang = {}, run_extra or {}, hang
        self.resumed_loss, self.stopped_status = resumed_loss or LOSS, stopped_status
        self.created = threading.Event()
        super().__init__()

    def _job(self, **fields) -> dict:
        job_id = len(self.jobs) + 1
        job = {"id": job_id, "run_id": 100 + job_id, "queue": "cpu", "status": "running", **fields}
        self.jobs[job_id] = job
        return job

    def _handler(self):
        stub = self

        class Handler(JsonHandler):
            def do_POST(self):
                body = self._body()
                if self.path == "/api/v1/jobs/":
                    return self._answer(201, stub._job(parameters=body["parameters"], kind="new"))
                source = int(self.path.split("/")[4])
                resumed = stub._job(kind="resume", source_checkpoint_id=9, source_checkpoint_step=20, of=source)
                return self._answer(201, resumed)

            def do_GET(self):
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if parts[2] == "jobs":
                    job = dict(stub.jobs[int(parts[3])])
                    if not stub.hang:
                        stopped = "mado_probe_fail_at_step" in (job.get("parameters") or {})
                        job["status"] = stub.stopped_status if stopped else "succeeded"
                    return self._answer(200, job)
                run_id = int(parts[3])
                resumed = any(job["run_id"] == run_id and job["kind"] == "resume" for job in stub.jobs.values())
                if len(parts) == 4:
                    return self._answer(200, {"id": run_id, **(stub.run_extra if resumed else {})})
                key = parse_qs(url.query).get("key")
                if not key:
                    return self._answer(200, {"keys": ["system/cpu", "train.loss"]})
                loss = {s: v for s, v in stub.resumed_loss.items() if s >= 20} if resumed else LOSS
                results = [{"step": step, "value": value, "timestamp": 0} for step, value in sorted(loss.items())]
                return self._answer(200, {"count": len(results), "next": None, "results": results})

        return Handler


def _probe(stub: ProbeStub, *args: str):
    env = {"MMT_API_URL": stub.url, "MMT_API_TOKEN": "t", "MMT_PROJECT": None}
    argv = ["probe-resume", "--code-version", "5", "--kill-at-step", "27", "--interval", "0.05", *args]
    return CliRunner().invoke(main, argv, env=env, catch_exceptions=False)


def test_an_exact_resume_exits_0_after_launching_stopping_and_resuming():
    with ProbeStub(run_extra={"parity": IDENTICAL, "restore_report": ALL_RESTORED}) as stub:
        done = _probe(stub, "--steps", "30", "--queue", "cpu")
    assert done.exit_code == 0, done.output
    assert [job.get("parameters") for job in stub.jobs.values()] == [
        {"mado_probe_end_at_step": 30},
        {"mado_probe_end_at_step": 30, "mado_probe_fail_at_step": 27},
        None,
    ]
    assert stub.jobs[3]["of"] == 2
    assert "restore report: every part of the checkpoint was restored" in done.output
    assert "parity with the interrupted run: identical (7 steps, 1 keys)" in done.output
    assert "against the uninterrupted run: identical (10 steps, 1 keys)" in done.output
    assert done.output.rstrip().endswith("verdict: identical")


def test_a_part_not_restored_and_a_divergence_exit_1_naming_both():
    diverged = {
        **IDENTICAL,
        "verdict": "diverged",
        "step": 20,
        "key": "train.loss",
        "parent_value": 0.047,
        "child_value": 0.05,
    }
    report = {**ALL_RESTORED, "not_restored": ["rng.torch"], "details": {"rng.torch": "re-seeded with 0 after load"}}
    with ProbeStub(run_extra={"parity": diverged, "restore_report": report}, resumed_loss={20: 0.05}) as stub:
        done = _probe(stub)
    assert done.exit_code == 1, done.output
    assert "not restored from the checkpoint: rng.torch — re-seeded with 0 after load" in done.output
    assert "diverged at step 20: train.loss 0.047 (interrupted) vs 0.05 (resumed)" in done.output
    assert "verdict: diverged" in done.output


def test_without_a_server_verdict_the_uninterrupted_run_decides():
    with ProbeStub(resumed_loss={**LOSS, 25: 0.5}) as stub:
        done = _probe(stub)
    assert done.exit_code == 1, done.output
    assert "parity with the interrupted run: the server gives no verdict" in done.output
    assert "against the uninterrupted run: diverged at step 25: train.loss" in done.output


@pytest.mark.parametrize(
    ("stub", "args", "code", "said"),
    [
        (
            dict(stopped_status="succeeded"),
            (),
            1,
            "expected succeeded and failed: does the code log metrics at step 27",
        ),
        (dict(hang=True), ("--timeout", "1"), 4, "job 1 is still running after --timeout"),
        ({}, ("--steps", "27"), 2, "must be above --kill-at-step 27"),
    ],
)
def test_a_probe_that_cannot_conclude_says_why(stub, args, code, said):
    with ProbeStub(**stub) as server:
        done = _probe(server, *args)
    assert done.exit_code == code, done.output
    assert said in done.output


@pytest.mark.parametrize(
    ("parts", "details", "causes"),
    [
        (
            {"model": "restored", "optimizer": "not_restored", "data_position": "not_declared"},
            {
                "optimizer": "param group 0: lr 0.03645 at the load, 0.5 at the first optimizer step: set after "
                "load_checkpoint, not by the restored scheduler (its lr: 0.03645)",
                "data_position": "the checkpoint declares no data position, so where the data resumes is not "
                "checked: declare it with save_checkpoint(..., data_position=...)",
            },
            [
                "cause: optimizer not restored — param group 0: lr 0.03645 at the load, 0.5 at the first optimizer "
                "step: set after load_checkpoint, not by the restored scheduler (its lr: 0.03645)",
                "cause: data_position not declared in the checkpoint — the checkpoint declares no data position, so "
                "where the data resumes is not checked: declare it with save_checkpoint(..., data_position=...)",
            ],
        ),
        (
            {"model": "restored", "rng.torch": "unknown"},
            {},
            ["cause: not named (the restore report says every part it checked was restored)"],
        ),
    ],
)
def test_a_diverged_probe_prints_the_first_differing_step_and_the_parts_that_may_cause_it(parts, details, causes):
    diverged = {**IDENTICAL, "verdict": "diverged", "step": 22, "key": "train.loss", "parent_value": 0.043}
    report = {**ALL_RESTORED, "parts": parts, "details": details}
    report["not_restored"] = sorted(part for part, status in parts.items() if status == "not_restored")
    with ProbeStub(run_extra={"parity": diverged, "restore_report": report}, resumed_loss={**LOSS, 21: 0.5}) as stub:
        done = _probe(stub)
    assert done.exit_code == 1, done.output
    lines = done.output.splitlines()
    start = lines.index("first differing step: 21 (train.loss)")  # the uninterrupted run's comparison, before 22
    assert lines[start + 1 : start + 1 + len(causes)] == causes
    if "data_position" in parts:
        assert f"not declared in the checkpoint: data_position — {details['data_position']}" in lines
