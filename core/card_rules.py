"""The card's own state (issues 27, 32): the llmb-card recording rules' arithmetic, in Python.

Same order and operations as mixin/rules/card.py: per GPU the share of the busy samples of
`rate_window` a power, brake or thermal clock event reason was active, the mean SM clock of
the busy samples and the highest memory clock against their maxima, and the enforced power
limit against the default; per engine the worst of the GPUs its processes hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from core import series as llmb
from core.card import (
    BRAKE_REASONS,
    HW_SLOWDOWN,
    HW_SLOWDOWN_EXPLAINED_BY,
    IDLE_REASON,
    POWER_REASONS,
    THERMAL_REASONS,
)
from core.promql import Data, EngineKey, avg_over_time, max_by, max_over_time
from core.thresholds import threshold_seconds

GpuKey = tuple[str, str]  # (host, gpu)


def _gpu(labels: dict[str, str]) -> GpuKey:
    return labels.get("host", ""), labels.get("gpu", "")


def _held(d: Data, reasons: tuple[str, ...]) -> list[tuple[GpuKey, float]]:
    """Per series, the samples of the window each of `reasons` was active in; HW slowdown's
    less those of HW thermal slowdown on the same series labels (`core.card`: NVML sets 0x8
    with 0x40), never below 0: `hw - ignoring (reason) (thermal or 0 * hw)`."""
    rw = threshold_seconds("rate_window")
    counts: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for lab, pts in d.range(llmb.GPU_CLOCK_EVENT_REASON_ACTIVE, rw):
        rest = tuple(sorted((k, v) for k, v in lab.items() if k != "reason"))
        counts[lab.get("reason", "")][rest] = sum(v for _, v in pts)
    out = []
    for reason in reasons:
        for rest, n in counts[reason].items():
            if reason == HW_SLOWDOWN:
                n = max(n - counts[HW_SLOWDOWN_EXPLAINED_BY].get(rest, 0.0), 0.0)
            out.append((_gpu(dict(rest)), n))
    return out


def _share(d: Data, reasons: tuple[str, ...]) -> dict[GpuKey, float]:
    """Of the samples in which the GPU was busy (not `gpu_idle`), the share in which the most
    persistent of `reasons` was active: `clamp_max(max by (host, gpu) (sum_over_time(
    reason{reason=~...}[rw])) / (busy samples > 0), 1)`."""
    rw = threshold_seconds("rate_window")
    held = max_by(_held(d, reasons))
    busy = max_by(
        (_gpu(lab), len(pts) - sum(v for _, v in pts))
        for lab, pts in d.range(llmb.GPU_CLOCK_EVENT_REASON_ACTIVE, rw)
        if lab.get("reason", "") == IDLE_REASON
    )
    return {k: min(v / busy[k], 1.0) for k, v in held.items() if k in busy and busy[k] > 0}


def _clock_ratio(
    d: Data, clock: str, over: Callable[[list[tuple[int, float]]], float]
) -> dict[GpuKey, float]:
    """`max by (host, gpu) (over(clock[rw])) / (max by (host, gpu) (<clock>_max) > 0)`."""
    rw = threshold_seconds("rate_window")
    high = max_by((_gpu(lab), over(pts)) for lab, pts in d.range(clock, rw))
    name = clock.replace("_busy", "").replace("_hertz", "_max_hertz")
    top = max_by((_gpu(lab), v) for lab, v in d.instant(name))
    return {k: v / top[k] for k, v in high.items() if k in top and top[k] > 0}


def _always_idle(d: Data) -> dict[GpuKey, float]:
    """`max by (host, gpu) (min_over_time(reason{reason="gpu_idle"}[rw]))`: 1 where every
    sample of the window said GPU idle."""
    rw = threshold_seconds("rate_window")
    return max_by(
        (_gpu(lab), min(v for _, v in pts))
        for lab, pts in d.range(llmb.GPU_CLOCK_EVENT_REASON_ACTIVE, rw)
        if lab.get("reason", "") == IDLE_REASON
    )


def sm_clock_ratio(d: Data) -> dict[GpuKey, float]:
    """The mean SM clock of the window's busy samples (`llmb_gpu_sm_clock_busy_hertz`, only
    exported while busy) / its maximum, per GPU; absent without a busy sample."""
    return _clock_ratio(d, llmb.GPU_SM_CLOCK_BUSY_HERTZ, avg_over_time)


def memory_clock_ratio(d: Data) -> dict[GpuKey, float]:
    """`clamp_max(memory clock ratio, 1)` per GPU: what the roofline's bandwidth scales by;
    absent (no scaling) where the GPU was idle in every sample (GDDR drops its clock then)."""
    idle = _always_idle(d)
    ratio = _clock_ratio(d, llmb.GPU_MEMORY_CLOCK_HERTZ, max_over_time)
    return {k: min(v, 1.0) for k, v in ratio.items() if idle.get(k) != 1}


def power_limit_ratio(d: Data) -> dict[GpuKey, float]:
    """`max by (host, gpu) (enforced limit) / (max by (host, gpu) (default limit) > 0)`."""
    enforced = max_by((_gpu(lab), v) for lab, v in d.instant(llmb.GPU_POWER_LIMIT_WATTS))
    default = max_by((_gpu(lab), v) for lab, v in d.instant(llmb.GPU_POWER_LIMIT_DEFAULT_WATTS))
    return {k: v / default[k] for k, v in enforced.items() if k in default and default[k] > 0}


def _per_engine(
    d: Data,
    per_gpu: dict[GpuKey, float],
    pick: Callable[[Iterable[float]], float],
) -> dict[EngineKey, float]:
    """`pick` over the GPUs each engine's processes hold (`engine_gpu:...:sum` joined)."""
    held: dict[tuple[str, str], set[str]] = defaultdict(set)
    for lab, _ in d.instant(
        llmb.GPU_PROCESS_MEMORY_USED_BYTES, lambda lab: lab.get("engine", "") != ""
    ):
        held[(lab.get("host", ""), lab.get("engine", ""))].add(lab.get("gpu", ""))
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for lab, _ in d.instant(llmb.ENGINE_UP):
        kinds[(lab.get("host", ""), lab.get("engine", ""))].add(lab.get("kind", ""))
    out: dict[EngineKey, float] = {}
    for (host, engine), gpus in held.items():
        values = [per_gpu[(host, g)] for g in sorted(gpus) if (host, g) in per_gpu]
        if not values:
            continue
        for kind in kinds.get((host, engine), ()):
            out[EngineKey(host, engine, kind)] = pick(values)
    return out


def card_values(d: Data) -> dict[str, dict[EngineKey, float]]:
    """The card-state Signals fields per engine (field -> values); the share of the gap the
    lost clock explains needs the efficiencies (`core.card.shortfall_explained`)."""
    return {
        "card_power_slowdown": _per_engine(d, _share(d, POWER_REASONS), max),
        "card_thermal_slowdown": _per_engine(d, _share(d, THERMAL_REASONS), max),
        "sm_clock_ratio": _per_engine(d, sm_clock_ratio(d), min),
        "card_brake_slowdown": _per_engine(d, _share(d, BRAKE_REASONS), max),
        "power_limit_ratio": _per_engine(d, power_limit_ratio(d), min),
        "memory_clock_ratio": _per_engine(d, memory_clock_ratio(d), min),
    }
