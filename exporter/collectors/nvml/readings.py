"""What the NVML backends read, as typed values (exporter/collectors/nvml/backend.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes; `reserved` is None when only the v1 query is available."""

    total: int
    used: int
    free: int
    reserved: int | None


@dataclass(frozen=True)
class Utilization:
    """NVML utilization rates in percent (0-100) over the driver's last sample period."""

    gpu: float
    memory: float


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU; `used_bytes` is None where NVML cannot tell."""

    pid: int
    used_bytes: int | None
