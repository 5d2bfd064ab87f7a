"""Lightning's ``fit(ckpt_path=...)`` resumed mid-epoch is not exact on its own; with ``MadoResume`` and a
``ResumableDataLoader`` it ends byte-identical to an uninterrupted fit, and a loader that cannot be restored is named
before the first step (docs/design/resume.md#exact-resume)."""

import logging

import pytest
import torch

from tests.sdk.lightning_fits import Events, example, fit, restore_torch_globals, weights


@pytest.fixture(scope="module", autouse=True)
def _torch_globals():
    restore = restore_torch_globals()
    yield
    restore()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """For each data loader (exact: ResumableDataLoader, plain: a shuffled DataLoader): the weights of an
    uninterrupted 40-step fit and the directory of a fit that failed at step 27 (checkpoints at 10 and 20)."""
    found = {}
    for exact_data in (True, False):
        root = tmp_path_factory.mktemp("exact" if exact_data else "plain")
        reference = weights(fit(root / "reference", exact_data=exact_data))
        with pytest.raises(example.SimulatedFailure):
            fit(root / "failed", exact_data=exact_data, fail_at=27)
        found[exact_data] = reference, root / "failed"
    return found


def _resumed(runs, tmp_path, *, exact_data: bool, mado_resume: bool, seen: list | None = None) -> bool:
    reference, failed = runs[exact_data]
    callbacks = [Events(seen)] if seen is not None else []
    model = fit(
        tmp_path,
        exact_data=exact_data,
        mado_resume=mado_resume,
        ckpt_path=failed / "epoch=1-step=20.ckpt",
        callbacks=callbacks,
    )
    return weights(model) == reference


def test_the_failed_fit_left_checkpoints_at_global_steps_10_and_20(runs):
    assert sorted(path.name for path in runs[True][1].iterdir()) == ["epoch=0-step=10.ckpt", "epoch=1-step=20.ckpt"]


def test_with_mado_resume_and_a_resumable_loader_the_resumed_fit_is_byte_identical(runs, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mado_tracking"):
        assert _resumed(runs, tmp_path, exact_data=True, mado_resume=True)
    assert not [record.getMessage() for record in caplog.records if record.name == "mado_tracking"]


@pytest.mark.parametrize(
    ("exact_data", "mado_resume"),
    [(False, False), (False, True), (True, False)],
    ids=["plain-lightning", "rngs-only", "data-position-only"],
)
def test_without_both_the_rngs_and_the_data_position_the_resumed_fit_differs(runs, tmp_path, exact_data, mado_resume):
    assert not _resumed(runs, tmp_path, exact_data=exact_data, mado_resume=mado_resume)


def test_a_loader_without_state_dict_is_named_before_the_first_resumed_step(runs, tmp_path, caplog):
    seen = []

    class Recorder(logging.Handler):
        def emit(self, record):
            seen.append(("warning", record.getMessage()))

    handler = Recorder(level=logging.WARNING)
    logging.getLogger("mado_tracking").addHandler(handler)
    try:
        _resumed(runs, tmp_path, exact_data=False, mado_resume=True, seen=seen)
    finally:
        logging.getLogger("mado_tracking").removeHandler(handler)
    warnings = [index for index, (kind, _) in enumerate(seen) if kind == "warning"]
    assert len(warnings) == 1, seen
    message = seen[warnings[0]][1]
    assert message.startswith("mado: data position not restored: DataLoader has no state_dict")
    assert "epoch 1 resumes at batch 4 of 16" in message and "ResumableDataLoader" in message
    assert seen[warnings[0] + 1] == ("step", 20)  # said before the first step, which is step 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_cuda_rng_is_saved_and_the_resumed_fit_is_byte_identical(tmp_path):
    reference = weights(fit(tmp_path / "reference", accelerator="gpu"))
    with pytest.raises(example.SimulatedFailure):
        fit(tmp_path / "failed", fail_at=27, accelerator="gpu")
    saved = torch.load(tmp_path / "failed" / "epoch=1-step=20.ckpt", weights_only=True, map_location="cpu")
    assert "cuda" in saved["callbacks"]["MadoResume"]["rng"]
    resumed = fit(tmp_path / "resumed", ckpt_path=tmp_path / "failed" / "epoch=1-step=20.ckpt", accelerator="gpu")
    assert weights(resumed) == reference
