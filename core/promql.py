"""PromQL 2.x selector and function semantics over raw samples: the building blocks every
recording rule's Python twin (`core.rules`, `core.card_rules`, `core.prefill_rules`) shares.

`Data` is the series at one evaluation time; `rate_max`, `avg_max`, `peak_max`,
`instant_max` are `max by (host, engine, kind)` of rate/avg_over_time/max_over_time/an
instant lookup, with Prometheus' extrapolation and window edges, bit for bit.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from core import series as llmb
from core.roofline import tp_bandwidth

Labels = tuple[tuple[str, str], ...]
# (metric name, sorted label pairs): the same key tests/plugins/exporter.py parses to.
SeriesKey = tuple[str, Labels]
# A series: (unix seconds, value) pairs in time order.
Points = Sequence[tuple[float, float]]

_K = TypeVar("_K")  # a `by (...)` grouping key
LOOKBACK_SECONDS = 300.0  # Prometheus' default instant-vector lookback delta


@dataclass(frozen=True, order=True)
class EngineKey:
    """The labels every per-engine recorded series keeps (missing label = "")."""

    host: str
    engine: str
    kind: str


def series_from_scrapes(
    scrapes: Iterable[tuple[float, Mapping[SeriesKey, float]]],
) -> dict[SeriesKey, list[tuple[float, float]]]:
    """Turn (time, {series: value}) scrapes into {series: [(time, value), ...]}."""
    out: dict[SeriesKey, list[tuple[float, float]]] = defaultdict(list)
    for at, samples in scrapes:
        for key, value in samples.items():
            out[key].append((at, float(value)))
    return dict(out)


def _ms(seconds_: float) -> int:
    # Prometheus keeps millisecond timestamps; rounding here keeps the arithmetic identical.
    return round(seconds_ * 1000)


class Data:
    """Series indexed by metric name, with PromQL 2.x selector semantics at one time."""

    def __init__(self, series: Mapping[SeriesKey, Points], at: float):
        self.at = _ms(at)
        self.by_name: dict[str, list[tuple[dict[str, str], list[tuple[int, float]]]]] = defaultdict(
            list
        )
        # Sorted by labels, as a PromQL selector returns series: sums then add in the same order.
        for (name, labels), points in sorted(series.items()):
            pts = [(_ms(ts), float(v)) for ts, v in points if _ms(ts) <= self.at]
            self.by_name[name].append((dict(labels), pts))

    def instant(
        self, name: str, match: Callable[[dict[str, str]], bool] | None = None
    ) -> list[tuple[dict[str, str], float]]:
        """The newest sample of each series within the lookback window."""
        out = []
        lo = self.at - _ms(LOOKBACK_SECONDS)
        for labels, pts in self.by_name.get(name, []):
            if match is not None and not match(labels):
                continue
            if pts and pts[-1][0] >= lo:
                out.append((labels, pts[-1][1]))
        return out

    def range(
        self, name: str, window: float
    ) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
        """Samples of each series in [at - window, at] (Prometheus 2.x: both ends closed)."""
        lo = self.at - _ms(window)
        out = []
        for labels, pts in self.by_name.get(name, []):
            sel = [p for p in pts if p[0] >= lo]
            if sel:
                out.append((labels, sel))
        return out


def extrapolated(
    points: list[tuple[int, float]], at: int, window: float, rate: bool
) -> float | None:
    """PromQL rate()/increase() of a counter, with Prometheus' extrapolation to the window."""
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    if last_t <= first_t:
        # Two samples of one millisecond (diagnose's sampler and a step's edge; Prometheus
        # never stores both): no interval to extrapolate over, as with one sample.
        return None
    result = last_v - first_v
    prev = first_v
    for _, v in points[1:]:
        if v < prev:  # a counter reset
            result += prev
        prev = v
    range_start = at - _ms(window)
    duration_to_start = (first_t - range_start) / 1000
    duration_to_end = (at - last_t) / 1000
    sampled = (last_t - first_t) / 1000
    average = sampled / (len(points) - 1)
    if result > 0 and first_v >= 0:
        duration_to_zero = sampled * (first_v / result)
        if duration_to_zero < duration_to_start:
            duration_to_start = duration_to_zero
    threshold = average * 1.1
    interval = sampled
    interval += duration_to_start if duration_to_start < threshold else average / 2
    interval += duration_to_end if duration_to_end < threshold else average / 2
    factor = interval / sampled
    if rate:
        factor /= window
    return result * factor


def _kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    # Neumaier's compensated summation step, as Prometheus' kahanSumInc.
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def avg_over_time(points: list[tuple[int, float]]) -> float:
    # The compensated incremental mean of Prometheus 2.42's avg_over_time, bit for bit.
    mean = count = c = 0.0
    for _, v in points:
        count += 1
        if math.isinf(mean):
            if math.isinf(v) and (mean > 0) == (v > 0):
                continue
            if not math.isinf(v) and not math.isnan(v):
                continue
        mean, c = _kahan_inc(v / count - mean / count, mean, c)
    return mean if math.isinf(mean) else mean + c


def engine_key(labels: Mapping[str, str]) -> EngineKey:
    return EngineKey(labels.get("host", ""), labels.get("engine", ""), labels.get("kind", ""))


def max_by(items: Iterable[tuple[_K, float]]) -> dict[_K, float]:
    """PromQL `max by (...)`: NaN only when every value is NaN."""
    out: dict[_K, float] = {}
    for key, value in items:
        old = out.get(key)
        if old is None or math.isnan(old) or (not math.isnan(value) and value > old):
            out[key] = value
    return out


def divide(
    num: Mapping[EngineKey, float], den: Mapping[EngineKey, float]
) -> dict[EngineKey, float]:
    """`num / (den > 0)` matched one-to-one on the engine labels."""
    return {k: v / den[k] for k, v in num.items() if k in den and den[k] > 0}


def instant_max(
    d: Data, name: str, match: Callable[[dict[str, str]], bool] | None = None
) -> dict[EngineKey, float]:
    """`max by (host, engine, kind) (name)` at `d.at`."""
    return max_by((engine_key(lab), v) for lab, v in d.instant(name, match))


def max_over_time(points: list[tuple[int, float]]) -> float:
    # Prometheus' max_over_time: NaN only when every sample is NaN.
    out = points[0][1]
    for _, v in points[1:]:
        if math.isnan(out) or v > out:
            out = v
    return out


def peak_max(d: Data, name: str, window: float) -> dict[EngineKey, float]:
    """`max by (...) (max_over_time(name[window]))`."""
    return max_by((engine_key(lab), max_over_time(pts)) for lab, pts in d.range(name, window))


def rate_max(d: Data, name: str, window: float) -> dict[EngineKey, float]:
    """`max by (...) (rate(name[window]))`."""
    vals = []
    for lab, pts in d.range(name, window):
        r = extrapolated(pts, d.at, window, rate=True)
        if r is not None:
            vals.append((engine_key(lab), r))
    return max_by(vals)


def not_cpu(lab: Mapping[str, str]) -> bool:
    return re.fullmatch(r"(?i)cpu.*", lab.get("device", "")) is None


def sum_of_device_max(
    d: Data, name: str, match: Callable[[dict[str, str]], bool]
) -> dict[EngineKey, float]:
    """`sum by (...) (max by (..., device) (name{match}))`."""
    pairs = d.instant(name, match)
    return sum_of_max(((engine_key(lab), lab.get("device", "")), v) for lab, v in pairs)


def sum_of_max(items: Iterable[tuple[tuple[EngineKey, str], float]]) -> dict[EngineKey, float]:
    """`sum by (engine) (max by (engine, part) (...))`: a number beats NaN, as in PromQL."""
    out: dict[EngineKey, float] = {}
    for (key, _), v in max_by(items).items():
        out[key] = out.get(key, 0.0) + v
    return out


def avg_max(d: Data, name: str, window: float) -> dict[EngineKey, float]:
    """`max by (...) (avg_over_time(name[window]))`."""
    return max_by((engine_key(lab), avg_over_time(pts)) for lab, pts in d.range(name, window))


def engine_gpus(d: Data, gpu_bw: Mapping[tuple[str, str], float]) -> dict[EngineKey, float]:
    """An engine's figure from a per-(host, gpu) one: each GPU does its share of a step (of the
    engine's GPU memory), the slowest sets the pace (`tp_bandwidth`); also the peak compute."""
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for lab, _ in d.instant(llmb.ENGINE_UP):
        kinds[(lab.get("host", ""), lab.get("engine", ""))].add(lab.get("kind", ""))
    per_pid = max_by(
        ((lab.get("host", ""), lab.get("engine", ""), lab.get("gpu", ""), lab.get("pid", "")), v)
        for lab, v in d.instant(
            llmb.GPU_PROCESS_MEMORY_USED_BYTES, lambda lab: lab.get("engine", "") != ""
        )
    )
    per_gpu: dict[tuple[str, str, str], float] = {}
    for (host, engine, gpu, _), v in sorted(per_pid.items()):
        gk3 = (host, engine, gpu)
        per_gpu[gk3] = per_gpu[gk3] + v if gk3 in per_gpu else v
    held: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for (host, engine, gpu), mem in sorted(per_gpu.items()):
        bw = gpu_bw.get((host, gpu))
        held[(host, engine)].append((math.nan if bw is None else bw, mem))
    bandwidth: dict[EngineKey, float] = {}
    for (host, engine), items in held.items():
        if all(math.isnan(bw) for bw, _ in items):
            continue  # no bandwidth known for any of its GPUs: absent, as the join drops it
        value = tp_bandwidth(items)
        if value is None:
            continue
        for kind in kinds.get((host, engine), ()):
            bandwidth[EngineKey(host, engine, kind)] = value
    return bandwidth
