"""GPU (NVML) and host (psutil) sampling for the dashboard: frozen, timestamped snapshots.

Every NVML call goes through one guard: any `NVMLError` (no driver, GPU lost, call not supported)
becomes None, which the UI renders as N/A; `sample()` never raises. NVML is initialised lazily
on the first sample; without it the device count is 0 and the snapshot says why in `note`, and
the host part (RAM, CPU, the run's process RSS) is still filled.

History lives here too: `GpuHistory` keeps a bounded ring buffer per GPU (and one for the host),
separate from the charts that draw it. The per-step training series live in `state.RunState`.

Note: inside a container NVML may report host PIDs for GPU processes; the per-process memory is
then matched to the run's PIDs only when the PID namespaces agree.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil

MIB = 1024 * 1024
# NVML reports "not available" per-process memory as this sentinel (unsigned -1).
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
# Samples kept per GPU by GpuHistory (at 1 Hz: one hour).
HISTORY_SAMPLES = 3600


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: float | None


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one moment; None means the value could not be read (render as N/A)."""

    index: int
    name: str | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None
    processes: tuple[GpuProcess, ...] = ()

    def process_mib(self, pids: Iterable[int]) -> float | None:
        """GPU memory used on this GPU by the given processes (None when none of them is listed)."""
        wanted = set(pids)
        used = [p.used_mib for p in self.processes if p.pid in wanted and p.used_mib is not None]
        return sum(used) if used else None


@dataclass(frozen=True)
class HostSnapshot:
    cpu_pct: float | None
    ram_used_mib: float | None
    ram_total_mib: float | None
    process_rss_mib: dict[int, float] = field(default_factory=dict)  # only the pids that were alive


@dataclass(frozen=True)
class MonitorSnapshot:
    time: float
    gpus: tuple[GpuSnapshot, ...]
    host: HostSnapshot
    nvml_ok: bool
    note: str = ""

    def gpu_for_pid(self, pid: int) -> int | None:
        """Index of the GPU on which NVML lists `pid`, if any."""
        for gpu in self.gpus:
            if any(p.pid == pid for p in gpu.processes):
                return gpu.index
        return None


def _import_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class Monitor:
    """Samples NVML and psutil. Cheap to construct; NVML is initialised on the first `sample`.

    Args:
        nvml: A pynvml-like module (tests pass a fake); None imports `pynvml` lazily.
    """

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml
        self._initialised = False
        self._nvml_ok = False
        self._init_note = ""
        self._handles: list[Any] = []
        self._names: dict[int, str | None] = {}
        self._processes: dict[int, psutil.Process] = {}
        psutil.cpu_percent(interval=None)  # primes psutil's CPU counter so the first sample means something

    # ---- NVML --------------------------------------------------------------------------------
    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML function; any NVML error (or a missing function) gives None."""
        nvml = self._nvml
        try:
            return fn(*args)
        except Exception as exc:  # NVMLError subclasses, plus AttributeError from old bindings
            if nvml is not None and isinstance(exc, getattr(nvml, "NVMLError", ())):
                return None
            if isinstance(exc, (AttributeError, TypeError, ValueError, OSError)):
                return None
            raise

    def _ensure_init(self) -> bool:
        if self._initialised:
            return self._nvml_ok
        self._initialised = True
        if self._nvml is None:
            self._nvml = _import_pynvml()
        nvml = self._nvml
        if nvml is None:
            self._init_note = "NVML unavailable: nvidia-ml-py not installed — showing host RAM and CPU"
            return False
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._init_note = f"NVML unavailable: {_nvml_reason(exc)} — showing host RAM and CPU"
            return False
        self._nvml_ok = True
        count = self._guard(nvml.nvmlDeviceGetCount) or 0
        self._handles = [self._guard(nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        if not count:
            self._init_note = "NVML found no GPU — showing host RAM and CPU"
        return True

    @property
    def device_count(self) -> int:
        self._ensure_init()
        return len(self._handles)

    def _gpu(self, index: int, handle: Any) -> GpuSnapshot:
        nvml, guard = self._nvml, self._guard
        if handle is None:
            return GpuSnapshot(index, None, None, None, None, None, None)
        if index not in self._names:  # the name never changes: ask once
            name = guard(nvml.nvmlDeviceGetName, handle)
            self._names[index] = name.decode() if isinstance(name, bytes) else name
        mem = guard(nvml.nvmlDeviceGetMemoryInfo, handle)
        util = guard(nvml.nvmlDeviceGetUtilizationRates, handle)
        temp = guard(nvml.nvmlDeviceGetTemperature, handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        power = guard(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
        procs = guard(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or ()
        return GpuSnapshot(
            index=index,
            name=self._names[index],
            memory_used_mib=_attr_mib(mem, "used"),
            memory_total_mib=_attr_mib(mem, "total"),
            utilization_pct=_attr_float(util, "gpu"),
            temperature_c=float(temp) if isinstance(temp, (int, float)) else None,
            power_w=power / 1000.0 if isinstance(power, (int, float)) else None,
            processes=tuple(_gpu_process(p) for p in procs if isinstance(getattr(p, "pid", None), int)),
        )

    # ---- host --------------------------------------------------------------------------------
    def _host(self, pids: Iterable[int]) -> HostSnapshot:
        try:
            vm = psutil.virtual_memory()
            ram_used, ram_total = (vm.total - vm.available) / MIB, vm.total / MIB
        except (psutil.Error, OSError):
            ram_used = ram_total = None
        try:
            cpu: float | None = psutil.cpu_percent(interval=None)
        except (psutil.Error, OSError):
            cpu = None
        rss: dict[int, float] = {}
        for pid in pids:
            proc = self._processes.get(pid)
            try:
                if proc is None:
                    proc = self._processes[pid] = psutil.Process(pid)
                rss[pid] = proc.memory_info().rss / MIB
            except (psutil.Error, OSError):
                pass  # gone (or not ours to read): leave it out
        # keep handles only for pids still asked about and alive (no growth over many runs)
        self._processes = {pid: self._processes[pid] for pid in rss}
        return HostSnapshot(cpu, ram_used, ram_total, rss)

    # ---- public ------------------------------------------------------------------------------
    def sample(self, pids: Iterable[int] = ()) -> MonitorSnapshot:
        """A snapshot of every local GPU and the host; `pids` are the run's processes (for RSS)."""
        pids = tuple(pids)
        nvml_ok = self._ensure_init()
        gpus: tuple[GpuSnapshot, ...] = ()
        if nvml_ok:
            gpus = tuple(self._gpu(i, h) for i, h in enumerate(self._handles))
        note = self._init_note
        if nvml_ok and gpus and all(g.memory_used_mib is None for g in gpus):
            note = "NVML returned no readings (GPU lost or driver error) — values shown as N/A"
        return MonitorSnapshot(time=time.time(), gpus=gpus, host=self._host(pids), nvml_ok=nvml_ok, note=note)

    def close(self) -> None:
        """Shut NVML down (if it was started); sampling again re-initialises it."""
        if self._nvml_ok:
            self._guard(self._nvml.nvmlShutdown)
        self._initialised = self._nvml_ok = False
        self._init_note = ""
        self._handles = []
        self._names = {}


def _nvml_reason(exc: BaseException) -> str:
    name = type(exc).__name__
    if "LibraryNotFound" in name:
        return "no NVIDIA driver (libnvidia-ml not found)"
    if "DriverNotLoaded" in name:
        return "NVIDIA driver not loaded"
    if "NoPermission" in name:
        return "no permission to read the GPU"
    return str(exc) or name


def _attr_mib(obj: Any, name: str) -> float | None:
    value = getattr(obj, name, None)
    return value / MIB if isinstance(value, (int, float)) else None


def _attr_float(obj: Any, name: str) -> float | None:
    value = getattr(obj, name, None)
    return float(value) if isinstance(value, (int, float)) else None


def _gpu_process(proc: Any) -> GpuProcess:
    used = getattr(proc, "usedGpuMemory", None)
    ok = isinstance(used, int) and used != NVML_VALUE_NOT_AVAILABLE and used >= 0
    return GpuProcess(pid=int(proc.pid), used_mib=used / MIB if ok else None)


class GpuHistory:
    """Ring buffers of recent samples: per GPU (time, used MiB, utilisation %) and the host
    (time, RAM used MiB, CPU %). Bounded (`maxlen` samples each); the chart reads, never owns, them."""

    def __init__(self, maxlen: int = HISTORY_SAMPLES) -> None:
        self.maxlen = maxlen
        self._gpus: dict[int, deque[tuple[float, float | None, float | None]]] = {}
        self._host: deque[tuple[float, float | None, float | None]] = deque(maxlen=maxlen)

    def add(self, snapshot: MonitorSnapshot) -> None:
        for gpu in snapshot.gpus:
            ring = self._gpus.setdefault(gpu.index, deque(maxlen=self.maxlen))
            ring.append((snapshot.time, gpu.memory_used_mib, gpu.utilization_pct))
        self._host.append((snapshot.time, snapshot.host.ram_used_mib, snapshot.host.cpu_pct))

    @property
    def gpu_indices(self) -> list[int]:
        return sorted(self._gpus)

    def gpu(self, index: int) -> tuple[list[float], list[float | None], list[float | None]]:
        """(times, used MiB, utilisation %) of one GPU, oldest first (None where unreadable)."""
        ring = self._gpus.get(index, ())
        return [r[0] for r in ring], [r[1] for r in ring], [r[2] for r in ring]

    def host(self) -> tuple[list[float], list[float | None], list[float | None]]:
        """(times, RAM used MiB, CPU %) of the host, oldest first."""
        return [r[0] for r in self._host], [r[1] for r in self._host], [r[2] for r in self._host]

    def __len__(self) -> int:
        return len(self._host)
