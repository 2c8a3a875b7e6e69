"""NVML behind a small synchronous interface, with a real and a file-backed implementation.

`NvmlBackend` is the seam the NVML collector talks to. `PynvmlBackend` calls the
driver through nvidia-ml-py (`pynvml`); `NvmlFileBackend` reads NVML-shaped JSON
files, which is how the tests replay the real H200 captures and how the engine
simulators show "their" GPU memory without a GPU.

Devices are addressed by position `i` in `range(device_count())`; `index(i)` is
the NVML index that ends up in the `gpu` label. Every method raises `NvmlError`
on failure; `NvmlError.not_supported` tells an optional query the GPU does not
offer (bus width, clocks, utilization on some parts) from a real failure.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, cast

from exporter.collectors.nvml.file_merge import merge_device
from exporter.collectors.nvml.readings import GpuProcess, MemoryInfo, Utilization

F = TypeVar("F", bound=Callable[..., Any])

# NVML return codes the backends hand on (values from nvml.h, stable across releases).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
# Codes after which NVML itself must be initialized again (not just the call retried).
NVML_REINIT_CODES = frozenset(
    {1, 9, 15, 999}
)  # UNINITIALIZED, DRIVER_NOT_LOADED, GPU_IS_LOST, UNKNOWN


class NvmlError(Exception):
    """An NVML call failed; `code` is NVML's return code when there is one."""

    def __init__(
        self,
        message: str,
        code: int | None = None,
        reason: Literal["connect", "parse"] = "connect",
    ):
        super().__init__(message)
        self.code = code
        # "parse" only for fake files that cannot be read; everything else means the
        # driver (or the GPU) is not reachable.
        self.reason = reason

    @property
    def not_supported(self) -> bool:
        """True when the GPU or driver simply does not offer this query."""
        return self.code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)


class NvmlBackend(Protocol):
    """What the NVML collector needs from NVML. All methods block; call them off the loop."""

    def init(self) -> None:
        """Load and initialize NVML; raise NvmlError when there is no driver or GPU."""

    def shutdown(self) -> None:
        """Release NVML."""

    def driver_version(self) -> str:
        """Driver version string, e.g. '580.159.04'."""

    def device_count(self) -> int:
        """Number of GPUs NVML sees."""

    def index(self, i: int) -> int:
        """NVML index of the device at position i."""

    def name(self, i: int) -> str:
        """Product name, e.g. 'NVIDIA H200'."""

    def uuid(self, i: int) -> str:
        """Device UUID ('GPU-...')."""

    def memory(self, i: int) -> MemoryInfo:
        """Memory info: v2 (used excludes reserved) when supported, else v1."""

    def utilization(self, i: int) -> Utilization:
        """GPU and memory-controller busy percentages."""

    def memory_clock_mhz(self, i: int) -> tuple[int, int]:
        """Current and maximum memory clock in MHz."""

    def bus_width_bits(self, i: int) -> int:
        """Memory bus width in bits."""

    def sm_clock_mhz(self, i: int) -> tuple[int, int | None]:
        """Current and maximum SM clock in MHz (the maximum None when unknown)."""

    def power_mw(self, i: int) -> int:
        """Power draw in milliwatts."""

    def power_limit_mw(self, i: int) -> int:
        """The enforced power limit in milliwatts."""

    def power_default_limit_mw(self, i: int) -> int:
        """The card's default (stock) power limit in milliwatts."""

    def power_max_limit_mw(self, i: int) -> int:
        """The highest power limit the card accepts (`nvidia-smi -pl`), in milliwatts."""

    def temperature_c(self, i: int) -> int:
        """GPU core temperature in degrees Celsius."""

    def clock_event_reasons(self, i: int) -> int:
        """Bitmask of what holds the clocks down now (nvml.h `nvmlClocksEventReason*`)."""

    def processes(self, i: int) -> list[GpuProcess]:
        """Compute and graphics processes on the device, one entry per pid."""

    def cmdline(self, pid: int) -> list[str]:
        """argv of a process (empty when unknown, e.g. another pid namespace)."""


def read_proc_cmdline(proc_root: Path, pid: int) -> list[str]:
    """argv from `<proc_root>/<pid>/cmdline` (NUL-separated), or [] when unreadable."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _merge_processes(groups: list[list[GpuProcess]]) -> list[GpuProcess]:
    # A process with both a compute and a graphics context is listed twice with the
    # same figure; keep one entry (the larger, in case the two ever differ).
    by_pid: dict[int, GpuProcess] = {}
    for group in groups:
        for proc in group:
            seen = by_pid.get(proc.pid)
            if seen is None or (proc.used_bytes or 0) > (seen.used_bytes or 0):
                by_pid[proc.pid] = proc
    return list(by_pid.values())


def _device_int(fn_name: str) -> Callable[[PynvmlBackend, int], int]:
    """A PynvmlBackend method: NVML's integer query `fn_name` on device i."""

    def query(self: PynvmlBackend, i: int) -> int:
        return int(self._query(i, getattr(self._nvml, fn_name)))

    query.__name__ = query.__qualname__ = fn_name
    return query


class PynvmlBackend:
    """The real NVML, through nvidia-ml-py."""

    def __init__(self, proc_root: Path = Path("/proc")):
        self.proc_root = proc_root
        self._handles: list[Any] = []
        self._v1_only: set[int] = set()
        self._nvml: Any = None
        self._up = False  # nvmlInit succeeded and nvmlShutdown is still due

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlError(str(exc), getattr(exc, "value", None)) from exc

    def _query(self, i: int, fn: Any, *args: Any) -> Any:
        """NVML's `fn` on device `i` (its handle first, then `args`)."""
        return self._call(fn, self._handles[i], *args)

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # the dependency is declared; this is a broken install
            raise NvmlError(f"nvidia-ml-py is not installed: {exc}") from exc
        self._nvml = pynvml
        self._call(pynvml.nvmlInit)
        self._up = True
        count = self._call(pynvml.nvmlDeviceGetCount)
        self._handles = [self._call(pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        self._v1_only = set()

    def shutdown(self) -> None:
        if not self._up:
            return
        self._up = False
        self._handles = []
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass  # the driver went away: nothing left to release

    def driver_version(self) -> str:
        return str(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return len(self._handles)

    index = _device_int("nvmlDeviceGetIndex")

    def name(self, i: int) -> str:
        return str(self._query(i, self._nvml.nvmlDeviceGetName))

    def uuid(self, i: int) -> str:
        return str(self._query(i, self._nvml.nvmlDeviceGetUUID))

    def memory(self, i: int) -> MemoryInfo:
        nv = self._nvml
        if i not in self._v1_only:
            try:
                m = self._query(i, nv.nvmlDeviceGetMemoryInfo, nv.nvmlMemory_v2)
                return MemoryInfo(int(m.total), int(m.used), int(m.free), int(m.reserved))
            except NvmlError as exc:
                # Drivers before r510 lack the v2 query; remember so that the 10 Hz
                # sampler does not pay for a failing call every time.
                if not exc.not_supported and exc.code != NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                    raise
                self._v1_only.add(i)
        m = self._query(i, nv.nvmlDeviceGetMemoryInfo)
        return MemoryInfo(int(m.total), int(m.used), int(m.free), None)

    def utilization(self, i: int) -> Utilization:
        u = self._query(i, self._nvml.nvmlDeviceGetUtilizationRates)
        return Utilization(float(u.gpu), float(u.memory))

    def _clock_mhz(self, i: int, clock: int) -> tuple[int, int]:
        """The current and the maximum of one clock (`NVML_CLOCK_MEM`, `NVML_CLOCK_SM`)."""
        nv = self._nvml
        current = self._query(i, nv.nvmlDeviceGetClockInfo, clock)
        maximum = self._query(i, nv.nvmlDeviceGetMaxClockInfo, clock)
        return int(current), int(maximum)

    def memory_clock_mhz(self, i: int) -> tuple[int, int]:
        return self._clock_mhz(i, self._nvml.NVML_CLOCK_MEM)

    bus_width_bits = _device_int("nvmlDeviceGetMemoryBusWidth")

    def sm_clock_mhz(self, i: int) -> tuple[int, int | None]:
        return self._clock_mhz(i, self._nvml.NVML_CLOCK_SM)

    power_mw = _device_int("nvmlDeviceGetPowerUsage")

    power_limit_mw = _device_int("nvmlDeviceGetEnforcedPowerLimit")

    power_default_limit_mw = _device_int("nvmlDeviceGetPowerManagementDefaultLimit")

    def power_max_limit_mw(self, i: int) -> int:
        # (minimum, maximum) of the limit that may be set.
        return int(self._query(i, self._nvml.nvmlDeviceGetPowerManagementLimitConstraints)[1])

    def temperature_c(self, i: int) -> int:
        sensor = self._nvml.NVML_TEMPERATURE_GPU  # the GPU die
        return int(self._query(i, self._nvml.nvmlDeviceGetTemperature, sensor))

    def clock_event_reasons(self, i: int) -> int:
        nv = self._nvml
        # The "events" name since driver r535; the "throttle" one before (same bits).
        fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(self._query(i, fn))

    def processes(self, i: int) -> list[GpuProcess]:
        nv = self._nvml
        groups = []
        for fn in (
            nv.nvmlDeviceGetComputeRunningProcesses,
            nv.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                procs = self._query(i, fn)
            except NvmlError as exc:
                if not exc.not_supported:
                    raise
                continue  # e.g. no graphics contexts on a headless data-center part
            groups.append([GpuProcess(int(p.pid), p.usedGpuMemory) for p in procs])
        return _merge_processes(groups)

    def cmdline(self, pid: int) -> list[str]:
        argv = read_proc_cmdline(self.proc_root, pid)
        if argv or self._nvml is None:
            return argv
        # Inside a container without the host pid namespace /proc has no such pid; the
        # driver still knows the executable's name.
        try:
            name = self._nvml.nvmlSystemGetProcessName(pid)
        except self._nvml.NVMLError:
            return []
        name = name.decode() if isinstance(name, bytes) else str(name)
        return [name] if name else []


def _reading_errors(method: F) -> F:
    """Turn a wrong-typed or impossible value of a fake reading into NvmlError("parse").

    A real driver reports a bad state as an NVML error; the fake one must too, so that a
    bad file takes the source down with one logged error instead of a TypeError per sample.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except NvmlError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise NvmlError(
                f"fake NVML reading: bad value in {method.__name__}: {exc!r}", reason="parse"
            ) from exc

    return cast(F, wrapper)


def _int_reading(name: str, key: str) -> Callable[[NvmlFileBackend, int], int]:
    """The fake backend's method `name`: the integer `key` of device i's reading."""

    def read(self: NvmlFileBackend, i: int) -> int:
        return int(self._field(self._dev(i), key))

    read.__name__ = read.__qualname__ = name
    return _reading_errors(read)


class NvmlFileBackend:
    """NVML readings from JSON files (`gpu.fake_file`): the simulators' GPU, replayed captures.

    The file format and the merge rules for several files are in docs/metrics.md ("GPU
    readings from files"). Files are re-read when they change; a missing file adds nothing.
    """

    def __init__(self, files: list[Path] | Path, proc_root: Path = Path("/proc")):
        self.files = [files] if isinstance(files, Path) else list(files)
        self.proc_root = proc_root
        self._cache: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}
        self._devices: list[dict[str, Any]] = []
        self._driver = ""
        self._cmdlines: dict[int, str] = {}

    def init(self) -> None:
        # Files may appear later (a simulator starting after the exporter): only a
        # sample finds out, so that the source recovers on the next sample.
        self._cache.clear()

    def shutdown(self) -> None:
        self._cache.clear()

    def _load(self, path: Path) -> dict[str, Any] | None:
        try:
            st = path.stat()
        except OSError:
            self._cache.pop(path, None)
            return None
        # mtime alone can miss two writes within one filesystem timestamp tick; an
        # atomic replace also changes the inode.
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise NvmlError(f"fake NVML file {path}: {exc}", reason="parse") from exc
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise NvmlError(f"fake NVML file {path}: no 'devices' list", reason="parse")
        self._cache[path] = (stamp, data)
        return data

    def _refresh(self) -> None:
        readings = [d for d in (self._load(p) for p in self.files) if d is not None]
        if not readings:
            names = ", ".join(str(p) for p in self.files)
            raise NvmlError(f"no fake NVML file exists ({names})")
        merged: dict[int, dict[str, Any]] = {}
        cmdlines: dict[int, str] = {}
        try:
            for reading in readings:
                for dev in reading["devices"]:
                    index = int(dev["index"])
                    procs = [dict(p) for p in dev.get("procs", [])]
                    for proc in procs:
                        cmdlines[int(proc["pid"])] = str(proc.get("cmdline", ""))
                    target = merged.get(index)
                    if target is None:
                        merged[index] = {**dev, "procs": procs}
                        continue
                    merge_device(target, dev, procs)
        except (KeyError, TypeError, ValueError) as exc:
            raise NvmlError(f"fake NVML file: bad device entry: {exc!r}", reason="parse") from exc
        self._devices = [merged[k] for k in sorted(merged)]
        self._driver = str(readings[0].get("driver", ""))
        self._cmdlines = cmdlines

    def _dev(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self._devices):
            raise NvmlError(f"fake NVML: no device at position {i}")
        return self._devices[i]

    @staticmethod
    def _field(dev: dict[str, Any], key: str) -> Any:
        if dev.get(key) is None:
            raise NvmlError(f"{key} not in the fake reading", NVML_ERROR_NOT_SUPPORTED)
        return dev[key]

    @_reading_errors
    def driver_version(self) -> str:
        self._refresh()
        return self._driver

    @_reading_errors
    def device_count(self) -> int:
        self._refresh()
        return len(self._devices)

    @_reading_errors
    def index(self, i: int) -> int:
        return int(self._dev(i)["index"])

    @_reading_errors
    def name(self, i: int) -> str:
        return str(self._dev(i).get("name", ""))

    @_reading_errors
    def uuid(self, i: int) -> str:
        return str(self._dev(i).get("uuid", ""))

    @_reading_errors
    def memory(self, i: int) -> MemoryInfo:
        dev = self._dev(i)
        v2 = dev.get("mem_v2")
        if v2 is not None:
            return MemoryInfo(
                int(v2["total"]), int(v2["used"]), int(v2["free"]), int(v2["reserved"])
            )
        v1 = self._field(dev, "mem")
        return MemoryInfo(int(v1["total"]), int(v1["used"]), int(v1["free"]), None)

    @_reading_errors
    def utilization(self, i: int) -> Utilization:
        util = self._field(self._dev(i), "util")
        gpu, memory = float(util["gpu"]), float(util["memory"])
        if not (math.isfinite(gpu) and math.isfinite(memory)):
            raise ValueError(f"utilization is not finite: {util!r}")
        return Utilization(gpu, memory)

    @_reading_errors
    def memory_clock_mhz(self, i: int) -> tuple[int, int]:
        dev = self._dev(i)
        current = int(self._field(dev, "mem_clock_mhz"))
        return current, int(dev.get("max_mem_clock_mhz") or current)

    bus_width_bits = _int_reading("bus_width_bits", "bus_width")

    @_reading_errors
    def sm_clock_mhz(self, i: int) -> tuple[int, int | None]:
        dev = self._dev(i)
        current = int(self._field(dev, "sm_clock_mhz"))
        maximum = dev.get("max_sm_clock_mhz")
        return current, None if maximum is None else int(maximum)

    power_mw = _int_reading("power_mw", "power_mw")
    power_limit_mw = _int_reading("power_limit_mw", "power_limit_mw")
    power_default_limit_mw = _int_reading("power_default_limit_mw", "power_default_limit_mw")
    power_max_limit_mw = _int_reading("power_max_limit_mw", "power_max_limit_mw")
    temperature_c = _int_reading("temperature_c", "temp")

    @_reading_errors
    def clock_event_reasons(self, i: int) -> int:
        reasons = self._field(self._dev(i), "clocks_event_reasons")
        # An int, or the "0x..." text nvidia-smi and the captures print.
        return int(reasons, 0) if isinstance(reasons, str) else int(reasons)

    @_reading_errors
    def processes(self, i: int) -> list[GpuProcess]:
        procs = self._dev(i).get("procs", [])
        return _merge_processes(
            [
                [
                    GpuProcess(int(p["pid"]), None if p.get("used") is None else int(p["used"]))
                    for p in procs
                ]
            ]
        )

    @_reading_errors
    def cmdline(self, pid: int) -> list[str]:
        recorded = self._cmdlines.get(pid)
        if recorded is not None:
            return recorded.split()
        return read_proc_cmdline(self.proc_root, pid)
