"""GPU memory, utilization and per-process memory from NVML, with windowed peaks.

A scrape every 15 s would miss a short memory spike (a long prompt's activations,
a KV cache growing and being freed), so a background thread samples device and
process memory at `gpu.sample_interval_seconds` (10 Hz by default) and keeps the
highest value seen over `gpu.peak_window_seconds`. `collect()` takes one more,
complete reading (so the values are never older than the scrape) and returns the
current values next to those peaks.

Without a driver or a GPU the source is down (`llmb_source_up{source="nvml"} 0`),
no GPU families are emitted and NVML is tried again every `retry_seconds`; the
exporter keeps serving the engines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

from config.settings import EngineConfig, GpuConfig
from core import series as llmb
from exporter.attribution import Attribution
from exporter.collectors import Collector, Scrape, SourceError
from exporter.collectors.nvml.backend import (
    NVML_REINIT_CODES,
    GpuProcess,
    MemoryInfo,
    NvmlBackend,
    NvmlError,
    NvmlFileBackend,
    PynvmlBackend,
)
from exporter.collectors.nvml.card import add_card_state
from exporter.schema import MetricSet
from model.gpu_specs import resolve_bandwidth, table_peak_flops

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_RETRY_SECONDS = 30.0


class WindowMax:
    """Running maximum over a sliding time window (monotonic deque: O(1) amortized per add)."""

    def __init__(self, window: float):
        self.window = window
        self._entries: deque[tuple[float, float]] = deque()

    def add(self, now: float, value: float) -> None:
        """Record `value` at time `now` (times must not go backwards)."""
        # An older, smaller value can never be the maximum again: drop it.
        while self._entries and self._entries[-1][1] <= value:
            self._entries.pop()
        self._entries.append((now, value))

    def max(self, now: float) -> float | None:
        """Highest value recorded in (now - window, now], or None when there is none."""
        while self._entries and self._entries[0][0] <= now - self.window:
            self._entries.popleft()
        return self._entries[0][1] if self._entries else None


@dataclass
class _Device:
    """Per-GPU facts read once per (re)initialization."""

    position: int
    index: int
    name: str
    uuid: str


@dataclass
class _Sample:
    """Memory of the selected GPUs and their processes at one moment."""

    memory: dict[int, MemoryInfo] = field(default_factory=dict)
    processes: dict[int, list[GpuProcess]] = field(default_factory=dict)


class NvmlCollector(Collector):
    """Reads the GPUs through an NvmlBackend; `source` is 'nvml'."""

    source = "nvml"

    def __init__(
        self,
        config: GpuConfig,
        attribution: Attribution,
        backend: NvmlBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ):
        self.config = config
        self.attribution = attribution
        if backend is None:
            backend = NvmlFileBackend(config.fake_file) if config.fake_file else PynvmlBackend()
        self.backend: NvmlBackend = backend
        self.clock = clock
        self.retry_seconds = retry_seconds
        self.samples_total = 0
        # One lock around every backend call and the windows: the sampler thread and
        # collect() (run in a worker thread) must not interleave.
        self._lock = threading.Lock()
        self._initialized = False
        self._next_init = float("-inf")
        self._init_error: NvmlError | None = None
        self._logged_error: str | None = None
        self._devices: list[_Device] = []
        self._count = -1
        self._driver = ""
        self._argv: dict[int, list[str]] = {}
        self._windows: dict[Hashable, WindowMax] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background sampler thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="llmb-nvml-sampler", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop the sampler and release NVML."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)
        with self._lock:
            self._shutdown()

    def _run(self) -> None:
        interval = self.config.sample_interval_seconds
        logged: str | None = None
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception as exc:  # the sampler must outlive a backend bug
                # At 10 Hz a repeating bug would log ten tracebacks a second: log it once.
                text = f"{type(exc).__name__}: {exc}"
                if text != logged:
                    log.exception("NVML sampler failed")
                    logged = text
            else:
                logged = None
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def _ensure_init(self) -> bool:
        """Initialize NVML when needed and due; True when it is usable. Holds the lock."""
        if self._initialized:
            return True
        now = self.clock()
        if now < self._next_init:
            return False
        self._next_init = now + self.retry_seconds
        try:
            self.backend.init()
        except NvmlError as exc:
            self._init_error = exc
            self._shutdown()
            if str(exc) != self._logged_error:
                log.warning(
                    "NVML unavailable (%s): no GPU metrics; retrying every %.0f s",
                    exc,
                    self.retry_seconds,
                )
                self._logged_error = str(exc)
            return False
        if self._logged_error is not None:
            log.info("NVML available again")
        self._logged_error = None
        self._init_error = None
        self._initialized = True
        self._count = -1  # the first sample enumerates the devices
        return True

    def _shutdown(self) -> None:
        self._initialized = False
        self._devices = []
        self._count = -1
        try:
            self.backend.shutdown()
        except NvmlError:
            pass  # nothing left to release

    def _fail(self, exc: NvmlError) -> None:
        """A sample failed: re-initialize later when NVML itself is gone, not on every error."""
        if exc.code in NVML_REINIT_CODES:
            self._shutdown()
            self._next_init = self.clock() + self.retry_seconds

    # --- reading ------------------------------------------------------------------------

    def _selected(self, index: int, uuid: str) -> bool:
        if not self.config.devices:
            return True
        for wanted in self.config.devices:
            if isinstance(wanted, int) or wanted.isdigit():
                if int(wanted) == index:
                    return True
            elif wanted == uuid:
                return True
        return False

    def _enumerate(self, count: int) -> list[_Device]:
        self._count = count
        devices = []
        for i in range(count):
            index, uuid = self.backend.index(i), self.backend.uuid(i)
            if self._selected(index, uuid):
                devices.append(_Device(i, index, self.backend.name(i), uuid))
        return devices

    def _read(self) -> _Sample:
        b = self.backend
        # A real driver's device list is fixed after init; the fake backend's changes
        # when a simulator adds a device, which the count shows.
        count = b.device_count()
        if count != self._count:
            self._driver = b.driver_version()
            self._devices = self._enumerate(count)
        sample = _Sample()
        for dev in self._devices:
            sample.memory[dev.index] = b.memory(dev.position)
            sample.processes[dev.index] = b.processes(dev.position)
        return sample

    def _argv_of(self, pid: int) -> list[str]:
        argv = self._argv.get(pid)
        if argv is None:
            argv = self.backend.cmdline(pid)
            self._argv[pid] = argv
        return argv

    def _engine_of(self, pid: int) -> EngineConfig | None:
        return self.attribution.engine_for(pid, " ".join(self._argv_of(pid)))

    def _window(self, key: Hashable) -> WindowMax:
        win = self._windows.get(key)
        if win is None:
            win = self._windows[key] = WindowMax(self.config.peak_window_seconds)
        return win

    def _record(self, sample: _Sample) -> None:
        """Feed one sample into the peak windows."""
        now = self.clock()
        engine_sum = {e.name: 0.0 for e in self.attribution.engines}
        live: set[int] = set()
        for gpu, mem in sample.memory.items():
            self._window(("gpu", gpu)).add(now, mem.used)
            for proc in sample.processes.get(gpu, []):
                live.add(proc.pid)
                if proc.used_bytes is None:
                    continue
                self._window(("proc", gpu, proc.pid)).add(now, proc.used_bytes)
                engine = self._engine_of(proc.pid)
                if engine is not None:
                    engine_sum[engine.name] += proc.used_bytes
        for name, total in engine_sum.items():
            self._window(("engine", name)).add(now, total)
        # Forget exited processes: their pid may be reused by something else.
        for pid in [p for p in self._argv if p not in live]:
            del self._argv[pid]
        for key in [k for k in self._windows if isinstance(k, tuple) and k[0] == "proc"]:
            if key[2] not in live:
                del self._windows[key]
        self.samples_total += 1

    def sample_once(self) -> bool:
        """Take one background sample (what the sampler thread does); False when NVML is down."""
        with self._lock:
            if not self._ensure_init():
                return False
            try:
                self._record(self._read())
            except NvmlError as exc:
                self._fail(exc)
                return False
            return True

    # --- scrape -------------------------------------------------------------------------

    async def collect(self) -> Scrape:
        """Return the GPU families, or a down source when NVML is unavailable."""
        return await asyncio.to_thread(self._collect_sync)

    def _collect_sync(self) -> Scrape:
        with self._lock:
            if not self._ensure_init():
                err = self._init_error
                message = f"NVML unavailable: {err}" if err else "NVML unavailable"
                return Scrape(up=False, errors=[SourceError("connect", message)])
            try:
                return self._scrape()
            except NvmlError as exc:
                self._fail(exc)
                return Scrape(up=False, errors=[SourceError(exc.reason, f"NVML: {exc}")])

    def _optional(self, fn: Callable[[int], T], position: int) -> T | None:
        """Value of an optional query; None when this GPU does not support it."""
        try:
            return fn(position)
        except NvmlError as exc:
            if exc.not_supported:
                return None
            raise

    def _scrape(self) -> Scrape:
        sample = self._read()
        self._record(sample)
        now = self.clock()
        out = MetricSet()
        b = self.backend
        engine_sum = {e.name: 0.0 for e in self.attribution.engines}
        errors: list[SourceError] = []
        for dev in self._devices:
            gpu = str(dev.index)
            util = self._optional(b.utilization, dev.position)
            busy = util.gpu / 100.0 if util is not None else None
            errors += add_card_state(out, b, dev.position, gpu, busy)
            clocks = self._optional(b.memory_clock_mhz, dev.position)
            bus = self._optional(b.bus_width_bits, dev.position)
            cur_clock, max_clock = clocks if clocks is not None else (None, None)
            bandwidth = resolve_bandwidth(
                dev.name,
                dev.index,
                dev.uuid,
                max_clock,
                bus,
                self.config.bandwidth_bytes_per_second,
            )
            out.info(
                llmb.GPU_INFO,
                gpu=gpu,
                uuid=dev.uuid,
                name=dev.name,
                driver=self._driver,
                bandwidth_source=bandwidth.source,
            )
            mem = sample.memory[dev.index]
            out.add(llmb.GPU_MEMORY_TOTAL_BYTES, mem.total, gpu=gpu)
            out.add(llmb.GPU_MEMORY_USED_BYTES, mem.used, gpu=gpu)
            out.add(llmb.GPU_MEMORY_FREE_BYTES, mem.free, gpu=gpu)
            out.add(llmb.GPU_MEMORY_RESERVED_BYTES, mem.reserved, gpu=gpu)
            out.add(
                llmb.GPU_MEMORY_USED_PEAK_BYTES,
                self._window(("gpu", dev.index)).max(now),
                gpu=gpu,
            )
            if util is not None:
                out.add(llmb.GPU_UTILIZATION_RATIO, util.gpu / 100.0, gpu=gpu)
            if cur_clock is not None:
                out.add(llmb.GPU_MEMORY_CLOCK_HERTZ, cur_clock * 1e6, gpu=gpu)
            if max_clock is not None:
                out.add(llmb.GPU_MEMORY_CLOCK_MAX_HERTZ, max_clock * 1e6, gpu=gpu)
            out.add(llmb.GPU_MEMORY_BUS_WIDTH_BYTES, bus / 8 if bus is not None else None, gpu=gpu)
            out.add(llmb.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND, bandwidth.bytes_per_second, gpu=gpu)
            for dtype, flops in table_peak_flops(dev.name).items():
                out.add(llmb.GPU_PEAK_FLOPS, flops, gpu=gpu, dtype=dtype)
            for proc in sorted(sample.processes[dev.index], key=lambda p: p.pid):
                argv = self._argv_of(proc.pid)
                engine = self._engine_of(proc.pid)
                labels = {
                    "gpu": gpu,
                    "pid": str(proc.pid),
                    "process": os.path.basename(argv[0]) if argv else "",
                    "engine": engine.name if engine else "",
                }
                out.add(llmb.GPU_PROCESS_MEMORY_USED_BYTES, proc.used_bytes, **labels)
                window = self._windows.get(("proc", dev.index, proc.pid))
                peak = window.max(now) if window is not None else None
                out.add(llmb.GPU_PROCESS_MEMORY_USED_PEAK_BYTES, peak, **labels)
                if engine is not None and proc.used_bytes is not None:
                    engine_sum[engine.name] += proc.used_bytes
        out.add(llmb.GPU_SAMPLES_TOTAL, self.samples_total)
        # A configured engine with no GPU process gets an explicit 0: an absent series
        # would hide "the weights are not resident at all".
        for engine_cfg in self.attribution.engines:
            labels = {"engine": engine_cfg.name, "kind": engine_cfg.kind}
            out.add(llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES, engine_sum[engine_cfg.name], **labels)
            peak = self._window(("engine", engine_cfg.name)).max(now)
            out.add(llmb.ENGINE_PROCESS_GPU_MEMORY_PEAK_BYTES, peak, **labels)
        return Scrape(metrics=out.metrics(), errors=errors)
