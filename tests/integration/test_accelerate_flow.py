"""An Accelerate Job that fails at step 27, resumed from its latest checkpoint as a new Run, ends with the weights of
an uninterrupted Job byte for byte, its metric steps continuing the failed Run's curve, on PostgreSQL, Redis and S3
(docs/integrations.md; docs/design/resume.md#latest-checkpoint, #steps-continue, #in-the-code).

``examples/accelerate_training.py`` checkpoints every 10 steps through ``mado_tracking.integrations.accelerate``;
step 20 is in the middle of an epoch (12 batches an epoch, 2 a step), so the resumed Run restores the data position
as well as the model, optimizer, scheduler and RNGs, from the directory the worker extracted read-only.
"""

from tests.integration.framework_flow import assert_restored, fail_resume_and_compare, full_site, metric_steps


def test_an_accelerate_job_failed_at_27_resumes_from_20_to_the_uninterrupted_weights(
    postgres_url,
    redis_url,
    moto_endpoint,
    tmp_path,
):
    with full_site(tmp_path, postgres_url=postgres_url, redis_url=redis_url, moto_endpoint=moto_endpoint) as site:
        flow = fail_resume_and_compare(
            site, tmp_path, script="accelerate_training.py", args=["--steps", "40", "--checkpoint-every", "10"]
        )
        failed_steps = metric_steps(site, flow.failed["run_id"], "train.loss")
        resumed_steps = metric_steps(site, flow.resumed["run_id"], "train.loss")

    assert flow.resumed_weights.read_bytes() == flow.reference_weights.read_bytes()
    assert "resuming at step 20, epoch 3, batch 4" in flow.resumed_log
    assert "--fail-at-step 27" in flow.failed_log
    assert flow.resumed["run_id"] != flow.failed["run_id"]
    assert_restored(flow)
    assert sorted(c["step"] for c in flow.checkpoints) == [10, 20]
    for checkpoint in flow.checkpoints:
        assert (checkpoint["state"], checkpoint["framework"], checkpoint["includes_optimizer"]) == (
            "complete",
            "accelerate",
            True,
        )
        state = checkpoint["metadata"]["training_state"]
        assert state["global_step"] == checkpoint["step"]
        assert {"model", "optimizer", "scheduler", "rng.torch", "data_position"} <= set(state["parts"])
    assert failed_steps == list(range(27))  # steps 0..26 logged before the failure at 27
    assert resumed_steps == list(range(20, 40))  # one curve: the new Run takes over at the checkpoint's step
