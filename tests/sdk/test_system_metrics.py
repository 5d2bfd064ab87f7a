"""System metrics from the SDK against the real API: CPU, memory, disk, network and each GPU under ``system/``
keys, on their own thread, every ``MMT_SYSTEM_METRICS_INTERVAL`` seconds (docs/design/interfaces.md#system-metrics).
NVML is a fake module (no GPU here); psutil is the real one."""

import sys
import time
import types

import pytest

import mado_tracking
from mado_tracking import system
from runs.models import MetricPoint

pytestmark = pytest.mark.django_db(transaction=True)
HOST_KEYS = {
    "system/cpu_percent",
    "system/memory_percent",
    "system/memory_used_bytes",
    "system/disk_percent",
    "system/disk_read_bytes",
    "system/disk_write_bytes",
    "system/network_sent_bytes",
    "system/network_received_bytes",
}


def fake_nvml(gpus: int, *, fail_init: bool = False) -> types.ModuleType:
    """A stand-in for ``pynvml`` (nvidia-ml-py) reporting ``gpus`` GPUs: GPU i at 40+i % use, (i+1) GiB of 16 GiB
    used, 60+i °C."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_TEMPERATURE_GPU = 0

    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    nvml.nvmlInit = init
    nvml.nvmlDeviceGetCount = lambda: gpus
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h, memory=10)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30, total=16 * 2**30)
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 60 + h
    return nvml


def _wait_for(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_run_records_host_and_gpu_metrics_on_its_own_thread(mmt_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(2))
    monkeypatch.setenv("MMT_SYSTEM_METRICS_INTERVAL", "0.2")
    with mado_tracking.start_run() as run:
        run.log_metrics({"loss": 1.0}, step=7)
        _wait_for(lambda: MetricPoint.objects.filter(run_id=run.id, key="system/gpu1/temperature_c").exists())
        assert run.step == 8  # sampling never moves the training step
    keys = set(MetricPoint.objects.filter(run_id=run.id).values_list("key", flat=True))
    assert HOST_KEYS <= keys
    assert {
        f"system/gpu{i}/{name}"
        for i in (0, 1)
        for name in ("utilization_percent", "memory_used_bytes", "memory_percent", "temperature_c")
    } <= keys
    gpu1 = MetricPoint.objects.filter(run_id=run.id, key__startswith="system/gpu1/").order_by("id")
    values = {p.key: p.value for p in gpu1}
    assert values["system/gpu1/utilization_percent"] == 41 and values["system/gpu1/memory_percent"] == 12.5
    assert values["system/gpu1/memory_used_bytes"] == 2 * 2**30
    assert set(MetricPoint.objects.filter(run_id=run.id, key__startswith="system/").values_list("step", flat=True)) <= {
        0,
        7,
    }
    assert 0 <= MetricPoint.objects.filter(run_id=run.id, key="system/cpu_percent").first().value <= 100


@pytest.mark.parametrize("nvml", [None, "broken"])
def test_without_nvml_or_a_gpu_the_gpu_keys_are_skipped_silently(mmt_env, monkeypatch, nvml, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None if nvml is None else fake_nvml(1, fail_init=True))
    monkeypatch.setenv("MMT_SYSTEM_METRICS_INTERVAL", "0.2")
    with mado_tracking.start_run() as run:
        _wait_for(lambda: MetricPoint.objects.filter(run_id=run.id, key="system/cpu_percent").count() >= 2)
    assert not MetricPoint.objects.filter(run_id=run.id, key__contains="gpu").exists()
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


def test_interval_zero_turns_it_off(mmt_env, monkeypatch):
    monkeypatch.setenv("MMT_SYSTEM_METRICS_INTERVAL", "0")
    with mado_tracking.start_run() as run:
        run.log_metrics({"loss": 1.0})
        time.sleep(0.5)
    assert not MetricPoint.objects.filter(run_id=run.id, key__startswith="system/").exists()


@pytest.mark.parametrize("raw", ["fast", "-1", "nan", "inf"])
def test_a_bad_interval_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("MMT_SYSTEM_METRICS_INTERVAL", raw)
    with pytest.raises(ValueError, match="MMT_SYSTEM_METRICS_INTERVAL"):
        system.interval_from_env()


def test_the_default_interval_is_15_seconds(monkeypatch):
    monkeypatch.delenv("MMT_SYSTEM_METRICS_INTERVAL", raising=False)
    assert system.interval_from_env() == 15.0
