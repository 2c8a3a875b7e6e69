"""Host memory bandwidth: what bounds decode when routed experts live in host memory.

At decode batch sizes below 32 llama.cpp computes the experts that `--n-cpu-moe` or
`-ot exps=CPU` leave in host memory on the CPU, which reads them from host DRAM every
step; host memory bandwidth / those bytes bounds decode. No vendor table knows a host's
bandwidth (channels populated, DIMM speed, NUMA, a VM's share), so it is measured once:
`measure_host_bandwidth` copies a buffer larger than the last-level cache (source and
destination together 4x the cache, 256 MiB at most) in one thread per usable core and counts
read + write, 2x the bytes copied, over the fastest pass (passes repeat for half a second).

A copy reads and writes; llama.cpp's expert matmuls mostly read, at the engine's own thread
count and access pattern, so the engine may draw less than a copy moves (on the H200 host of
issue 32 it drew about 41.5 GiB/s). The figure is a measurement of this host, not a ceiling
proven for every access pattern: `--host-bandwidth-gbs` (diagnose, compare, decide, the
exporter) and the config's `host_memory_bandwidth_bytes_per_second` override it, and the
series `llmb_host_memory_bandwidth_bytes_per_second{source}` says which figure is in use.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

HostBandwidthSource = Literal["measured", "flag", "config"]

log = logging.getLogger(__name__)

# Each of the two buffers is this many times the last-level cache (clamped below), so that a
# pass (source + destination: 4x the cache) is not served from cache; 128 MiB when sysfs names
# no cache. The cap keeps the exporter within its container's memory (deploy/kubernetes:
# 512 MiB): both buffers together are 256 MiB at most, freed when the measurement returns.
_CACHE_MULTIPLE = 2
_MIN_BYTES = 32 * 2**20
_MAX_BYTES = 128 * 2**20
_DEFAULT_BYTES = 128 * 2**20
# The whole measurement (writing the buffers, then copy passes) stops starting passes this
# many seconds after it began: it stays under a second on any host that writes 256 MiB in
# half a second; the fastest pass counts.
_BUDGET_SECONDS = 0.5
_MAX_THREADS = 64


@dataclass(frozen=True)
class HostBandwidth:
    """Host memory bandwidth in bytes/s and where the figure comes from."""

    bytes_per_second: float
    source: HostBandwidthSource

    def describe(self) -> str:
        """'41.5 GB/s, measured' as the answers print it."""
        return f"{self.bytes_per_second / 1e9:.1f} GB/s, {self.source}"


def last_level_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache of CPU 0 as sysfs names it (None when unreadable)."""
    best = None
    for index in sysfs.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        try:
            size = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        except (ValueError, IndexError):
            continue
        best = size if best is None or size > best else best
    return best


def _threads() -> int:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 1
    return max(1, min(usable, _MAX_THREADS))


def measure_host_bandwidth(
    buffer_bytes: int | None = None,
    threads: int | None = None,
    budget_seconds: float = _BUDGET_SECONDS,
) -> float:
    """Bytes/s of host memory: 2 x bytes copied / seconds of the fastest copy pass.

    Each of `threads` threads copies its slice of a source buffer into a destination one
    with `ctypes.memmove`, which releases the GIL, so the threads copy in parallel. Both
    buffers are written before timing (no lazily mapped zero pages, no first-touch faults
    in the timed passes).
    """
    began = time.perf_counter()
    if buffer_bytes is None:
        llc = last_level_cache_bytes()
        want = _CACHE_MULTIPLE * llc if llc else _DEFAULT_BYTES
        buffer_bytes = max(_MIN_BYTES, min(_MAX_BYTES, want))
    n = threads or _threads()
    chunk = max(4096, buffer_bytes // n // 4096 * 4096)
    size = chunk * n
    src = (ctypes.c_char * size)()
    dst = (ctypes.c_char * size)()
    ctypes.memset(src, 1, size)
    ctypes.memset(dst, 2, size)
    base_src, base_dst = ctypes.addressof(src), ctypes.addressof(dst)

    def copy(i: int) -> None:
        ctypes.memmove(base_dst + i * chunk, base_src + i * chunk, chunk)

    return 2.0 * size / _fastest_pass(copy, n, began + budget_seconds)


def _fastest_pass(copy: Callable[[int], None], n: int, deadline: float) -> float:
    """Seconds of the fastest pass in which `n` threads each copy their slice once.

    The threads start once and meet at a barrier before and after every pass, so a pass
    times the copies, not the starting of threads. Each thread stamps its own copy; a pass
    lasts from the first start to the last end (a thread the scheduler delays makes the pass
    longer, never shorter: the figure errs low). Passes run until `deadline`, at least one.
    """
    start, done = threading.Barrier(n + 1), threading.Barrier(n + 1)
    stop = threading.Event()
    spans = [(0.0, 0.0)] * n

    def work(i: int) -> None:
        while True:
            start.wait()
            if stop.is_set():
                return
            t0 = time.perf_counter()
            copy(i)
            spans[i] = (t0, time.perf_counter())
            done.wait()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for w in workers:
        w.start()
    best, passes = float("inf"), 0
    try:
        while passes == 0 or time.perf_counter() < deadline:
            start.wait()
            done.wait()
            first, last = min(t for t, _ in spans), max(t for _, t in spans)
            best = min(best, max(last - first, 1e-9))
            passes += 1
    finally:
        stop.set()
        start.wait()
        for w in workers:
            w.join()
    return best


def host_bandwidth(
    flag_bytes_per_second: float | None,
    config_bytes_per_second: float | None,
    measure: Callable[[], float] = measure_host_bandwidth,
) -> HostBandwidth | None:
    """The figure to use: the flag, else the config key, else `measure()` (the seam tests
    replace: they inject a value rather than copy hundreds of MiB). A measurement that
    fails (no memory for the buffers, no threads) is logged and gives None: no bound, and
    the exporter or diagnose runs on without it."""
    if flag_bytes_per_second is not None:
        return HostBandwidth(flag_bytes_per_second, "flag")
    if config_bytes_per_second is not None:
        return HostBandwidth(config_bytes_per_second, "config")
    try:
        value = measure()
    except (MemoryError, OSError, RuntimeError, threading.BrokenBarrierError) as exc:
        log.warning("host memory bandwidth not measured: %s: %s", type(exc).__name__, exc)
        return None
    return HostBandwidth(value, "measured")
