"""System metrics sampled on their own thread while a Run is open (docs/design/interfaces.md#system-metrics).

Every ``MMT_SYSTEM_METRICS_INTERVAL`` seconds (default 15; 0 turns it off)
the monitor logs, under ``system/`` keys: ``cpu_percent``, ``memory_percent``,
``memory_used_bytes``, ``disk_percent`` (the working directory's file
system), ``disk_read_bytes`` / ``disk_write_bytes`` and ``network_sent_bytes``
/ ``network_received_bytes`` (bytes since the previous sample), and per
visible GPU ``system/gpu<i>/utilization_percent``, ``memory_used_bytes``,
``memory_percent`` and ``temperature_c`` through NVML (``nvidia-ml-py``,
installed by ``pip install 'mado-tracking[gpu]'``). Without that package or
without a GPU the GPU keys are skipped silently. The points carry the step
last logged by training, so they line up with it; their wall-clock time is
the sample's.
"""

import logging
import os
import threading

from mado_tracking.threads import leave_program_signals_to_main_thread

logger = logging.getLogger("mado_tracking")
ENV_INTERVAL = "MMT_SYSTEM_METRICS_INTERVAL"
DEFAULT_INTERVAL_S = 15.0


def interval_from_env() -> float:
    """Seconds between samples from ``MMT_SYSTEM_METRICS_INTERVAL`` (default 15, 0 = off).

    Raises ``ValueError`` naming the variable for a value that is not a number >= 0.
    """
    raw = os.environ.get(ENV_INTERVAL, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_INTERVAL}={raw!r}: give the seconds between samples, or 0 to turn it off") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{ENV_INTERVAL}={raw!r}: must be a finite number of seconds >= 0")
    return value


def _nvml():
    """The NVML module, initialised, or None (not installed, no driver, no GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 — no NVML for any reason: GPU keys are skipped silently
        return None


def gpu_sample(nvml) -> dict[str, float]:
    """``system/gpu<i>/…`` values of every GPU NVML sees (``{}`` when it sees none or fails)."""
    values = {}
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            use = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            prefix = f"system/gpu{index}/"
            values[prefix + "utilization_percent"] = float(use.gpu)
            values[prefix + "memory_used_bytes"] = float(memory.used)
            values[prefix + "memory_percent"] = 100.0 * memory.used / memory.total if memory.total else 0.0
            values[prefix + "temperature_c"] = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    except Exception:  # noqa: BLE001 — a GPU that vanished or an NVML error: this sample has no GPU keys
        return {}
    return values


class SystemMonitor:
    """Samples the machine every ``interval`` seconds on a daemon thread and hands each sample (a
    ``{key: float}``) to ``log``; ``stop()`` ends it. ``interval`` 0: nothing starts."""

    def __init__(self, log, interval: float):
        import psutil

        self._psutil = psutil
        self._log = log
        self._interval = interval
        self._stop = threading.Event()
        self._nvml = _nvml()
        self._io = self._counters()
        self._thread = threading.Thread(target=self._loop, name="mado-system-metrics", daemon=True)
        if interval > 0:
            psutil.cpu_percent(None)  # the first call only starts the CPU measurement
            self._thread.start()

    def _counters(self):
        disk = self._psutil.disk_io_counters()
        net = self._psutil.net_io_counters()
        return (
            disk.read_bytes if disk else 0,
            disk.write_bytes if disk else 0,
            net.bytes_sent if net else 0,
            net.bytes_recv if net else 0,
        )

    def sample(self) -> dict[str, float]:
        """One sample: CPU, memory, disk, network (bytes since the previous sample) and each GPU."""
        psutil = self._psutil
        memory = psutil.virtual_memory()
        now = self._counters()
        delta = [max(b - a, 0) for a, b in zip(self._io, now)]
        self._io = now
        values = {
            "system/cpu_percent": float(psutil.cpu_percent(None)),
            "system/memory_percent": float(memory.percent),
            "system/memory_used_bytes": float(memory.total - memory.available),
            "system/disk_percent": float(psutil.disk_usage(os.getcwd()).percent),
            "system/disk_read_bytes": float(delta[0]),
            "system/disk_write_bytes": float(delta[1]),
            "system/network_sent_bytes": float(delta[2]),
            "system/network_received_bytes": float(delta[3]),
        }
        if self._nvml is not None:
            values.update(gpu_sample(self._nvml))
        return values

    def _loop(self) -> None:
        leave_program_signals_to_main_thread()
        while not self._stop.wait(self._interval):
            try:
                self._log(self.sample())
            except Exception:  # noqa: BLE001 — sampling must never disturb training
                logger.debug("mado: a system metrics sample failed", exc_info=True)

    def stop(self) -> None:
        """End the thread (waits at most a second); idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
