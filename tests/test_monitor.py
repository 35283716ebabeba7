"""Monitor: the real no-NVML path of this machine, and fake pynvml modules (healthy, failing mid-query)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from grpo_tui.dashboard.monitor import MIB, NVML_VALUE_NOT_AVAILABLE, GpuHistory, Monitor, MonitorSnapshot


class FakeNVMLError(Exception):
    pass


class FakeLibraryNotFound(FakeNVMLError):
    pass


class FakeNvml:
    """A pynvml stand-in with two GPUs; `fail` names functions that raise NVMLError."""

    NVMLError = FakeNVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, fail: set[str] | None = None, init_error: Exception | None = None) -> None:
        self.fail = fail or set()
        self.init_error = init_error
        self.calls: dict[str, int] = {}

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.fail:
            raise FakeNVMLError(f"{name} failed")

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        self._call("nvmlDeviceGetHandleByIndex")
        return f"h{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        self._call("nvmlDeviceGetName")
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=(1000 + int(h[1:])) * MIB, total=143771 * MIB, free=0)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature")
        return 61

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        return 312_500  # mW

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[SimpleNamespace]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        if h == "h0":
            return [
                SimpleNamespace(pid=101, usedGpuMemory=2048 * MIB),
                SimpleNamespace(pid=102, usedGpuMemory=None),
                SimpleNamespace(pid=103, usedGpuMemory=NVML_VALUE_NOT_AVAILABLE),
            ]
        return [SimpleNamespace(pid=201, usedGpuMemory=512 * MIB)]


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_nvml_works(), reason="NVML works here: the no-driver path cannot be exercised")
def test_real_pynvml_without_driver_gives_host_only_snapshot() -> None:
    monitor = Monitor()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    snap = monitor.sample([os.getpid(), dead.pid])
    assert isinstance(snap, MonitorSnapshot)
    assert snap.nvml_ok is False and snap.gpus == () and monitor.device_count == 0
    assert snap.note.startswith("NVML unavailable:") and "host RAM and CPU" in snap.note
    assert snap.host.ram_total_mib and 0 < snap.host.ram_used_mib < snap.host.ram_total_mib
    assert snap.host.cpu_pct is not None
    assert set(snap.host.process_rss_mib) == {os.getpid()} and snap.host.process_rss_mib[os.getpid()] > 1
    monitor.close()  # nothing to shut down: must not raise
    assert monitor.sample().nvml_ok is False


def test_fake_nvml_snapshot_values() -> None:
    nvml = FakeNvml()
    monitor = Monitor(nvml)
    snap = monitor.sample()
    assert snap.nvml_ok and snap.note == "" and len(snap.gpus) == 2
    g0, g1 = snap.gpus
    assert (g0.index, g0.name, g0.memory_used_mib, g0.memory_total_mib) == (0, "NVIDIA H200", 1000.0, 143771.0)
    assert (g0.utilization_pct, g0.temperature_c, g0.power_w) == (87.0, 61.0, 312.5)
    assert g1.memory_used_mib == 1001.0
    assert [(p.pid, p.used_mib) for p in g0.processes] == [(101, 2048.0), (102, None), (103, None)]
    assert g0.process_mib([101, 102, 999]) == 2048.0 and g0.process_mib([999]) is None
    assert snap.gpu_for_pid(201) == 1 and snap.gpu_for_pid(5) is None


def test_nvml_initialised_once_and_name_asked_once() -> None:
    nvml = FakeNvml()
    monitor = Monitor(nvml)
    for _ in range(3):
        monitor.sample()
    assert nvml.calls["nvmlInit"] == 1 and nvml.calls["nvmlDeviceGetName"] == 2  # once per GPU
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 6
    monitor.close()
    assert nvml.calls["nvmlShutdown"] == 1
    monitor.sample()  # re-initialises after close
    assert nvml.calls["nvmlInit"] == 2


def test_nvml_error_mid_query_gives_none_for_that_value_only() -> None:
    nvml = FakeNvml(
        fail={"nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses"}
    )
    snap = Monitor(nvml).sample()
    assert all(g.temperature_c is None and g.power_w is None and g.processes == () for g in snap.gpus)
    assert all(g.memory_used_mib is not None and g.utilization_pct == 87.0 for g in snap.gpus)
    assert snap.nvml_ok and snap.note == ""


def test_gpu_lost_after_init_gives_na_everywhere_and_a_note() -> None:
    nvml = FakeNvml()
    monitor = Monitor(nvml)
    assert monitor.sample().gpus[0].memory_used_mib == 1000.0
    nvml.fail = {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetComputeRunningProcesses",
    }
    snap = monitor.sample()
    assert len(snap.gpus) == 2
    assert all(g.memory_used_mib is None and g.utilization_pct is None and g.power_w is None for g in snap.gpus)
    assert "N/A" in snap.note


def test_handle_lookup_failure_keeps_the_row_as_na() -> None:
    snap = Monitor(FakeNvml(fail={"nvmlDeviceGetHandleByIndex"})).sample()
    assert [g.index for g in snap.gpus] == [0, 1] and all(g.name is None for g in snap.gpus)


@pytest.mark.parametrize(
    ("error", "words"), [(FakeLibraryNotFound("x"), "no NVIDIA driver"), (FakeNVMLError("weird"), "weird")]
)
def test_init_failure_is_a_note_not_an_exception(error: Exception, words: str) -> None:
    nvml = FakeNvml(init_error=error)
    monitor = Monitor(nvml)
    snap = monitor.sample([os.getpid()])
    assert snap.nvml_ok is False and snap.gpus == () and words in snap.note
    assert os.getpid() in snap.host.process_rss_mib
    monitor.sample()
    assert nvml.calls["nvmlInit"] == 1  # not retried every sample
    monitor.close()
    assert "nvmlShutdown" not in nvml.calls


def test_history_ring_buffers_are_bounded_and_ordered() -> None:
    history = GpuHistory(maxlen=3)
    monitor = Monitor(FakeNvml())
    snaps = [monitor.sample() for _ in range(5)]
    for snap in snaps:
        history.add(snap)
    times, used, util = history.gpu(1)
    assert times == [s.time for s in snaps[-3:]] and used == [1001.0] * 3 and util == [87.0] * 3
    assert history.gpu_indices == [0, 1] and len(history) == 3
    host_times, ram, cpu = history.host()
    assert host_times == times and all(r is not None for r in ram)
    assert history.gpu(7) == ([], [], [])
