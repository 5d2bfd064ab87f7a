"""The Hugging Face Trainer through mado's Job flow (docs/integrations.md; docs/design/resume.md#latest-checkpoint,
#steps-continue): ``examples/hf_trainer.py`` (``MadoCallback``, a tiny BERT, gradient accumulation, a warm-up
scheduler, shuffled data, dropout) fails at global step 27 as a Job on PostgreSQL, Redis and S3, is resumed from its
latest checkpoint (step 20) as a new Run and ends with the weights of an uninterrupted Job, byte for byte.
"""

from contextlib import closing

from tests.integration.framework_flow import assert_restored, fail_resume_and_compare, full_site, metric_steps

ARGS = ["--steps", "40", "--checkpoint-every", "10"]


def test_a_trainer_job_failing_at_step_27_resumes_from_step_20_and_ends_with_the_uninterrupted_weights(
    postgres_url, redis_url, moto_endpoint, tmp_path
):
    with full_site(tmp_path, postgres_url=postgres_url, redis_url=redis_url, moto_endpoint=moto_endpoint) as site:
        flow = fail_resume_and_compare(site, tmp_path, script="hf_trainer.py", args=ARGS)
        assert "failed: --fail-at-step 27: stopping at global step 27" in flow.failed_log
        assert (flow.failed["status"], flow.failed["run_status"]) == ("failed", "failed")
        assert (flow.resumed["status"], flow.resumed["run_status"]) == ("succeeded", "finished")
        assert "resuming from " in flow.resumed_log
        # every checkpoint-N the Trainer saved became a Checkpoint at its global step
        assert [(c["step"], c["state"], c["framework"], c["includes_optimizer"]) for c in flow.checkpoints] == [
            (20, "complete", "transformers", True),
            (10, "complete", "transformers", True),
        ]
        state = flow.checkpoints[0]["metadata"]["training_state"]
        assert state["global_step"] == 20
        assert {"model", "optimizer", "scheduler", "rng.torch", "data_position"} <= set(state["parts"])

        failed_run, resumed_run = flow.failed["run_id"], flow.resumed["run_id"]
        assert (flow.resumed["resumed_from_run_id"], flow.resumed["source_checkpoint_step"]) == (failed_run, 20)
        with closing(site.client()) as client:
            assert client.request("GET", f"runs/{resumed_run}/")["parent_id"] == failed_run
        # one curve: the failed Run logged global steps 1..26, the resumed one goes on at 21
        assert metric_steps(site, failed_run, "train/loss") == list(range(1, 27))
        assert metric_steps(site, resumed_run, "train/loss") == list(range(21, 41))
        assert metric_steps(site, resumed_run, "eval/loss") == [30, 40]
        assert_restored(flow)

    assert flow.resumed_weights.read_bytes() == flow.reference_weights.read_bytes()
