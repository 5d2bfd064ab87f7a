"""``run.log_training_data_stage`` (docs/design/runs.md#data-stages-sdk): online against the live server, retried
safely; offline refused."""

import pytest
import requests

import mado_tracking
from mado_tracking.client import ApiClient
from mado_tracking.errors import ApiError, MadoError
from runs.models import DataStage
from tests.factories import DatasetFactory, DatasetVersionFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ids(project):
    dataset = DatasetFactory(project=project, name="digits")
    return [
        DatasetVersionFactory(dataset=dataset, version="v1").pk,
        DatasetVersionFactory(dataset=dataset, version="noisy").pk,
    ]


def test_it_records_the_stage(mmt_env, ids):
    with mado_tracking.start_run(name="staged") as run:
        stage = run.log_training_data_stage(15, ids, metadata={"note": "synthetic"})
    assert stage["start_step"] == 15 and stage["dataset_version_ids"] == sorted(ids)
    recorded = DataStage.objects.get()
    assert recorded.pk == stage["id"] and recorded.metadata == {"note": "synthetic"}


def test_a_lost_answer_is_resent_and_the_server_keeps_one_record(mmt_env, ids, monkeypatch):
    real_send = ApiClient.send
    seen = []

    def send(self, method, path, **kwargs):
        response = real_send(self, method, path, **kwargs)
        if path.endswith("/data-stages/"):
            seen.append(response.status_code)
            if len(seen) == 1:  # the server stored it, but the answer never reaches the client
                raise requests.ConnectionError("connection reset by peer")
        return response

    monkeypatch.setattr(ApiClient, "send", send)
    monkeypatch.setattr("mado_tracking.client.time.sleep", lambda seconds: None)
    with mado_tracking.start_run(name="retried") as run:
        stage = run.log_training_data_stage(15, ids, metadata={"note": "x"})
    assert seen == [201, 200]  # the server saw the same request twice
    assert DataStage.objects.count() == 1 and DataStage.objects.get().pk == stage["id"]


def test_a_different_set_at_a_recorded_step_raises_the_conflict(mmt_env, ids):
    with mado_tracking.start_run(name="conflict") as run:
        run.log_training_data_stage(15, ids)
        with pytest.raises(ApiError) as error:
            run.log_training_data_stage(15, ids[:1])
    assert error.value.status == 409 and str(sorted(ids)) in str(error.value)


@pytest.mark.parametrize("args", [(-1, [1]), (1, []), (1, "12"), (1, [1], "ckpt"), (1, [1], None, ["x"])])
def test_bad_arguments_fail_before_any_request(mmt_env, args):
    with mado_tracking.start_run(name="bad") as run:
        with pytest.raises(ValueError):
            run.log_training_data_stage(*args)
    assert not DataStage.objects.exists()


def test_offline_mode_raises_a_clear_error(tmp_path):
    with mado_tracking.start_run(offline=True, output=tmp_path / "run") as run:
        with pytest.raises(MadoError, match="online only"):
            run.log_training_data_stage(15, [1, 2])


def test_the_example_switches_its_loader_and_records_the_stage(mmt_env, ids):
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "training.py"
    argv = [
        sys.executable,
        str(example),
        "--steps",
        "20",
        "--checkpoint-every",
        "10",
        "--add-dataset-at-step",
        "15",
        "--dataset-version-ids",
        ",".join(map(str, ids)),
    ]
    done = subprocess.run(argv, env={**os.environ, **mmt_env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stage = DataStage.objects.get()
    assert stage.start_step == 15 and sorted(stage.dataset_versions.values_list("pk", flat=True)) == sorted(ids)
    assert stage.checkpoint.step == 10 and "noisy" in stage.metadata["note"]
