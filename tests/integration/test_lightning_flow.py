"""``examples/lightning_training.py`` as Jobs on PostgreSQL, Redis and S3: failed at global step 27, resumed from its
latest checkpoint (step 20) as a new Run, it ends byte-identical to an uninterrupted Job, its metric steps continue
at 20, and the failed Run lists ModelCheckpoint's saves at their global steps (docs/integrations.md;
docs/design/resume.md#latest-checkpoint, #steps-continue, #exact-resume)."""

import pytest

from tests.integration.framework_flow import assert_restored, fail_resume_and_compare, full_site, metric_steps


@pytest.mark.slow  # 50 to 85 s on two cores: a deployment and three Jobs, each importing torch and lightning
def test_a_lightning_fit_failed_at_27_and_resumed_from_20_ends_byte_identical(
    postgres_url,
    redis_url,
    moto_endpoint,
    tmp_path,
):
    with full_site(tmp_path, postgres_url=postgres_url, redis_url=redis_url, moto_endpoint=moto_endpoint) as site:
        flow = fail_resume_and_compare(
            site, tmp_path, script="lightning_training.py", args=["--steps", "40", "--checkpoint-every", "10"]
        )
        assert flow.resumed_weights.read_bytes() == flow.reference_weights.read_bytes()
        assert [(c["step"], c["state"], c["framework"]) for c in flow.checkpoints] == [
            (20, "complete", "lightning"),
            (10, "complete", "lightning"),
        ]
        assert "resuming from epoch=1-step=20.ckpt" in flow.resumed_log
        assert "data position not restored" not in flow.resumed_log
        assert_restored(flow)
        assert metric_steps(site, flow.failed["run_id"], "train.loss") == list(range(27))
        assert metric_steps(site, flow.resumed["run_id"], "train.loss") == list(range(20, 40))
