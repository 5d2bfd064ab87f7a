"""A checkpoint the stock Hugging Face MLflow integration saved (``layout: "files"``, no tar) restored outside a Job
with ``mado checkpoint restore``: exactly HF's ``checkpoint-N`` files, read-only, from which HF resumes; a tampered
stored file is refused and nothing is left (docs/design/checkpoints.md#mlflow-checkpoints, #save-and-restore).

Tiny model built from a config, generated data, nothing downloaded.
"""

import json
import stat

import pytest
from click.testing import CliRunner

from tests.factories import api_key

pytest.importorskip("mlflow")
pytest.importorskip("transformers")

from checkpoints import storage  # noqa: E402
from checkpoints.models import ManifestEntry  # noqa: E402
from mado_tracking.cli import main  # noqa: E402
from runs.models import Run  # noqa: E402
from tests.mlflow_client.test_mlflow_stock_integrations import _checkpoints, _files, _hf_train  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_hf_checkpoint_saved_through_mlflow_is_restored_by_the_cli_and_a_tampered_file_refused(
    mlflow_env, monkeypatch, tmp_path, api, project, member
):
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", str(project.pk))
    _hf_train(tmp_path / "out", report_to="mlflow")
    run = Run.objects.get(project=project)
    checkpoints = {c["step"]: c for c in _checkpoints(api(member), run)}
    assert {step: c["layout"] for step, c in checkpoints.items()} == {10: "files", 5: "files"}
    env = {"MMT_API_URL": mlflow_env, "MMT_API_TOKEN": api_key(member)}

    five = checkpoints[5]["id"]
    assert api(member).get(f"/api/v1/checkpoints/{five}/tar").status_code == 409  # no tar: the files instead
    done = CliRunner().invoke(main, ["checkpoint", "restore", str(five), "--into", str(tmp_path / "ck")], env=env)
    assert done.exit_code == 0, done.output
    restored = tmp_path / "ck" / "checkpoint"
    assert _files(restored) == _files(tmp_path / "out" / "checkpoint-5")
    assert stat.S_IMODE((restored / "trainer_state.json").stat().st_mode) == 0o444
    assert json.loads((tmp_path / "ck" / "resume-checkpoint.json").read_text())["step"] == 5
    assert f"MMT_RESUME_CHECKPOINT_DIR={restored}" in done.output
    resumed = _hf_train(tmp_path / "again", report_to="none", resume_from=str(restored))
    assert resumed.steps == [6, 7, 8, 9, 10]  # HF picked up at step 5 from the restored directory

    ten = checkpoints[10]["id"]
    entry = ManifestEntry.objects.select_related("artifact").get(checkpoint_id=ten, path="model.safetensors")
    stored = storage.artifact_storage().path(entry.artifact.storage_key)
    with open(stored, "r+b") as handle:  # the stored bytes go bad; the manifest and the Artifact row stay
        handle.seek(entry.size // 2)
        handle.write(b"\xff\xfe")
    done = CliRunner().invoke(main, ["checkpoint", "restore", str(ten), "--into", str(tmp_path / "bad")], env=env)
    assert done.exit_code == 1
    assert f"checkpoint {ten} is corrupt: model.safetensors: the stored object's SHA-256 is" in done.output
    assert not (tmp_path / "bad").exists()
