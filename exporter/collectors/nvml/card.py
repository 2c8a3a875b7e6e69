"""The card's own state: clocks and their maxima, power, temperature, clock event reasons.

A card held below its clocks by its power limit or its temperature decodes and prefills
slower while the engine is fine; NVML says so (issue 27). Each field is read on its own:
one the GPU does not offer is left out, one that fails is left out with its error reason,
and neither fails the scrape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from core import series as llmb
from core.thresholds import threshold_number
from exporter.collectors import SourceError
from exporter.collectors.nvml.backend import NvmlBackend, NvmlError
from exporter.schema import MetricSet

T = TypeVar("T")

# nvml.h `nvmlClocksEventReason*` (the former `nvmlClocksThrottleReason*`, same bits): label
# value -> bit. Every reason NVML names has a series, 0 or 1.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# Which of them count as a power or a thermal slowdown is the core's call (core/card.py).


def _field(errors: list[SourceError], fn: Callable[[int], T], position: int, what: str) -> T | None:
    """One field: its value, None when not supported, None plus an error when it failed."""
    try:
        return fn(position)
    except NvmlError as exc:
        if not exc.not_supported:
            errors.append(SourceError(exc.reason, f"NVML {what}: {exc}"))
        return None


# The power limits: series -> (backend query, what an error names).
POWER_LIMITS: tuple[tuple[str, str, str], ...] = (
    (llmb.GPU_POWER_LIMIT_WATTS, "power_limit_mw", "power limit"),
    (llmb.GPU_POWER_LIMIT_DEFAULT_WATTS, "power_default_limit_mw", "default power limit"),
    (llmb.GPU_POWER_LIMIT_MAX_WATTS, "power_max_limit_mw", "maximum power limit"),
)


def _busy(utilization: float | None, reasons: int | None) -> bool:
    """A kernel ran for `card_busy_utilization_min` of NVML's sample period, and NVML does
    not call the GPU idle."""
    idle = reasons is not None and bool(reasons & CLOCK_EVENT_REASONS["gpu_idle"])
    return (
        utilization is not None
        and utilization >= threshold_number("card_busy_utilization_min")
        and not idle
    )


def add_card_state(
    out: MetricSet, backend: NvmlBackend, position: int, gpu: str, utilization: float | None
) -> list[SourceError]:
    """Add one GPU's SM clock, power and its limits, temperature and reason families;
    return the fields' errors. (The memory clock and its maximum come with the bandwidth, in
    the collector.) `utilization` (0-1, None: unknown) tells a busy sample from an idle one."""
    errors: list[SourceError] = []
    reasons = _field(errors, backend.clock_event_reasons, position, "clock event reasons")
    sm = _field(errors, backend.sm_clock_mhz, position, "SM clock")
    if sm is not None:
        out.add(llmb.GPU_SM_CLOCK_HERTZ, sm[0] * 1e6, gpu=gpu)
        if sm[1] is not None:
            out.add(llmb.GPU_SM_CLOCK_MAX_HERTZ, sm[1] * 1e6, gpu=gpu)
        # Only in busy samples: its average over a window is the clock under load, which
        # the idle samples around the requests (boost clock, no work) would otherwise hide.
        if _busy(utilization, reasons):
            out.add(llmb.GPU_SM_CLOCK_BUSY_HERTZ, sm[0] * 1e6, gpu=gpu)
    power = _field(errors, backend.power_mw, position, "power draw")
    if power is not None:
        out.add(llmb.GPU_POWER_WATTS, power / 1000.0, gpu=gpu)
    for name, query, what in POWER_LIMITS:
        limit = _field(errors, getattr(backend, query), position, what)
        if limit is not None:
            out.add(name, limit / 1000.0, gpu=gpu)
    temp = _field(errors, backend.temperature_c, position, "temperature")
    if temp is not None:
        out.add(llmb.GPU_TEMPERATURE_CELSIUS, temp, gpu=gpu)
    if reasons is not None:
        for name, bit in CLOCK_EVENT_REASONS.items():
            active = 1 if reasons & bit else 0
            out.add(llmb.GPU_CLOCK_EVENT_REASON_ACTIVE, active, gpu=gpu, reason=name)
    return errors
