"""The recording rules' arithmetic over raw samples (what promtool computes), in Python.

From raw samples
    `SeriesKey` (metric name, sorted label pairs), `EngineKey` (host, engine, kind),
    `series_from_scrapes(scrapes)`,
    `verdicts_at(series, at) -> {EngineKey: Verdict}` and
    `rule_values_at(series, at) -> {EngineKey: RuleValues}` (also the decode rate,
    bandwidth, bytes per step and roofline): the same arithmetic as the recording rules
    (rate/increase with Prometheus' extrapolation, avg_over_time, max by engine, the GPU
    joins) at time `at`, with Prometheus 2.x window semantics (a range `[w]` holds the
    samples in `[at - w, at]`, an instant lookup takes the newest sample of the last 5
    minutes). This is what promtool computes when the rule groups run in file order
    (`group_eval_order`); a running Prometheus evaluates its groups independently, so
    there the verdict may trail the raw series by up to one evaluation interval per group.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TypeVar

from core.conditions import Verdict, evaluate
from core.prefill_rules import prefill_values
from core.roofline import (
    ModelStructure,
    accepted_tokens,
    active_weights_bytes,
    decode_batch,
    decode_bytes_per_step,
    decode_efficiency,
    experts_host_bound,
    roofline_facts,
    roofline_misfit,
    roofline_tokens_per_second,
    tp_bandwidth,
)
from core.signals import Signals
from core.thresholds import threshold_seconds

# ------------------------------------------------------------- signals from raw samples

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


@dataclass(frozen=True)
class RuleValues:
    """Every recorded per-engine value behind the verdict (None = absent) and the Signals."""

    signals: Signals
    decode_tokens_per_second: float | None
    bandwidth_bytes_per_second: float | None
    decode_bytes_per_step: float | None
    roofline_tokens_per_second: float | None
    decode_batch: float | None = None
    active_weights_bytes: float | None = None
    accepted_tokens_per_step: float | None = None
    # The physics gate: why the roofline does not fit (None: it fits or is unknown).
    misfit: str | None = None
    # Expert offload: per-sequence decode bound by host memory (None: no experts on host).
    experts_host_bound_tokens_per_second: float | None = None


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


class _Data:
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


def _extrapolated(
    points: list[tuple[int, float]], at: int, window: float, rate: bool
) -> float | None:
    """PromQL rate()/increase() of a counter, with Prometheus' extrapolation to the window."""
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
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


def _avg_over_time(points: list[tuple[int, float]]) -> float:
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


def _key(labels: Mapping[str, str]) -> EngineKey:
    return EngineKey(labels.get("host", ""), labels.get("engine", ""), labels.get("kind", ""))


def _max_by(items: Iterable[tuple[_K, float]]) -> dict[_K, float]:
    """PromQL `max by (...)`: NaN only when every value is NaN."""
    out: dict[_K, float] = {}
    for key, value in items:
        old = out.get(key)
        if old is None or math.isnan(old) or (not math.isnan(value) and value > old):
            out[key] = value
    return out


def _divide(
    num: Mapping[EngineKey, float], den: Mapping[EngineKey, float]
) -> dict[EngineKey, float]:
    """`num / (den > 0)` matched one-to-one on the engine labels."""
    return {k: v / den[k] for k, v in num.items() if k in den and den[k] > 0}


# --- admission and SGLang residency (issue 18): the recording rules' arithmetic ----------


def _instant_max(
    d: _Data, name: str, match: Callable[[dict[str, str]], bool] | None = None
) -> dict[EngineKey, float]:
    """`max by (host, engine, kind) (name)` at `d.at`."""
    return _max_by((_key(lab), v) for lab, v in d.instant(name, match))


def _max_over_time(points: list[tuple[int, float]]) -> float:
    # Prometheus' max_over_time: NaN only when every sample is NaN.
    out = points[0][1]
    for _, v in points[1:]:
        if math.isnan(out) or v > out:
            out = v
    return out


def _peak_max(d: _Data, name: str, window: float) -> dict[EngineKey, float]:
    """`max by (...) (max_over_time(name[window]))`."""
    return _max_by((_key(lab), _max_over_time(pts)) for lab, pts in d.range(name, window))


def _rate_max(d: _Data, name: str, window: float) -> dict[EngineKey, float]:
    """`max by (...) (rate(name[window]))`."""
    vals = []
    for lab, pts in d.range(name, window):
        r = _extrapolated(pts, d.at, window, rate=True)
        if r is not None:
            vals.append((_key(lab), r))
    return _max_by(vals)


def _is_sglang(lab: Mapping[str, str]) -> bool:
    return lab.get("kind", "") == "sglang"


def _not_cpu(lab: Mapping[str, str]) -> bool:
    return re.fullmatch(r"(?i)cpu.*", lab.get("device", "")) is None


def _sum_of_device_max(
    d: _Data, name: str, match: Callable[[dict[str, str]], bool]
) -> dict[EngineKey, float]:
    """`sum by (...) (max by (..., device) (name{match}))`."""
    return _sum_of_max(((_key(lab), lab.get("device", "")), v) for lab, v in d.instant(name, match))


def _sum_of_max(items: Iterable[tuple[tuple[EngineKey, str], float]]) -> dict[EngineKey, float]:
    """`sum by (engine) (max by (engine, part) (...))`: a number beats NaN, as in PromQL."""
    out: dict[EngineKey, float] = {}
    for (key, _), v in _max_by(items).items():
        out[key] = out.get(key, 0.0) + v
    return out


def admission_values(d: _Data) -> dict[str, dict[EngineKey, float]]:
    """The admission and SGLang-residency signals per engine (Signals field -> values).

    The same arithmetic, in the same order, as their recording rules (mixin/rules/recording.py
    `admission_rules`): running against its cap, the KV the running requests plus one more
    would need against the pool, and SGLang's process GPU memory beyond its KV pool. Peaks
    over `queue_window`, not averages: the pool binds at its fullest moment, and averages
    count the gaps between one request's end and the next one's admission.
    """
    qw, rw = threshold_seconds("queue_window"), threshold_seconds("rate_window")
    peak = _peak_max(d, "llmb_engine_requests_running", qw)
    slots = _instant_max(d, "llmb_engine_slots")
    capacity = _instant_max(d, "llmb_engine_kv_cache_capacity_tokens")
    held = _peak_max(d, "llmb_engine_kv_cache_used_tokens", qw)
    prompt = _rate_max(d, "llmb_engine_prompt_tokens_total", rw)
    generated = _rate_max(d, "llmb_engine_generation_tokens_total", rw)
    finished = _rate_max(d, "llmb_engine_requests_finished_total", rw)
    out: dict[str, dict[EngineKey, float]] = {
        "running_slots_ratio": _divide(peak, slots),
        "kv_demand_held_ratio": {},
        "kv_demand_finished_ratio": {},
        "weights_memory_beyond_kv_ratio": {},
    }
    for key, r in peak.items():
        c = capacity.get(key)
        if c is None or not c > 0:
            continue
        if key in held and r > 0:
            out["kv_demand_held_ratio"][key] = held[key] * (r + 1) / r / c
        if key in prompt and key in generated and key in finished and finished[key] > 0:
            per_request = (prompt[key] + generated[key]) / finished[key]
            out["kv_demand_finished_ratio"][key] = (r + 1) * per_request / c
    sglang = _is_sglang
    process = _instant_max(d, "llmb_engine_process_gpu_memory_bytes", sglang)
    reported = _sum_of_device_max(
        d, "llmb_engine_kv_cache_bytes", lambda lab: sglang(lab) and _not_cpu(lab)
    )
    estimated = _instant_max(d, "llmb_model_kv_cache_bytes_estimated", sglang)
    weights = _instant_max(d, "llmb_model_weights_bytes")
    for key, mem in process.items():
        kv = reported.get(key, estimated.get(key))
        w = weights.get(key)
        if kv is not None and w is not None and w > 0:
            out["weights_memory_beyond_kv_ratio"][key] = (mem - kv) / w
    return out


def _avg_max(d: _Data, name: str, window: float) -> dict[EngineKey, float]:
    """`max by (...) (avg_over_time(name[window]))`."""
    return _max_by((_key(lab), _avg_over_time(pts)) for lab, pts in d.range(name, window))


def _bandwidth(d: _Data) -> dict[EngineKey, float]:
    """Each engine's bandwidth, scaled by the memory clock the window reached (1: unknown)."""
    named = d.instant("llmb_gpu_memory_bandwidth_bytes_per_second")
    gpu_bw = _max_by(((lab.get("host", ""), lab.get("gpu", "")), v) for lab, v in named)
    clock = _card().memory_clock_ratio(d)
    return _engine_gpus(d, {k: bw * clock.get(k, 1.0) for k, bw in gpu_bw.items()})


def _engine_gpus(d: _Data, gpu_bw: Mapping[tuple[str, str], float]) -> dict[EngineKey, float]:
    """An engine's figure from a per-(host, gpu) one: each GPU does its share of a step (of the
    engine's GPU memory), the slowest sets the pace (`tp_bandwidth`); also the peak compute."""
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for lab, _ in d.instant("llmb_engine_up"):
        kinds[(lab.get("host", ""), lab.get("engine", ""))].add(lab.get("kind", ""))
    per_pid = _max_by(
        ((lab.get("host", ""), lab.get("engine", ""), lab.get("gpu", ""), lab.get("pid", "")), v)
        for lab, v in d.instant(
            "llmb_gpu_process_memory_used_bytes", lambda lab: lab.get("engine", "") != ""
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


# ModelStructure field -> its series (diagnose reads the same series into its results).
STRUCTURE_SERIES = {
    "weights_bytes": "llmb_model_weights_bytes",
    "always_read_bytes": "llmb_model_weights_always_read_bytes",
    "routed_expert_bytes": "llmb_model_weights_routed_experts_bytes",
    "experts": "llmb_model_experts",
    "experts_used": "llmb_model_experts_used",
    "token_embedding_row_bytes": "llmb_model_token_embedding_row_bytes",
    "draft_weights_bytes": "llmb_model_draft_weights_bytes",
}


def _signal_values(d: _Data) -> dict[str, dict[EngineKey, float]]:
    """The Signals fields that are one recording rule each (field -> values per engine)."""
    rw, qw = threshold_seconds("rate_window"), threshold_seconds("queue_window")
    weights = _instant_max(d, "llmb_model_weights_bytes")
    on_gpu = _sum_of_device_max(d, "llmb_engine_model_buffer_bytes", _not_cpu)
    # Only host buffers reported (a CPU build, `-ngl 0`): 0 on the GPU, not an absent series.
    buffers = {k: on_gpu.get(k, 0.0) for k in _instant_max(d, "llmb_engine_model_buffer_bytes")}
    return {
        "layers_ratio": _divide(
            _instant_max(d, "llmb_engine_gpu_layers_offloaded"),
            _instant_max(d, "llmb_engine_gpu_layers_total"),
        ),
        "weights_buffers_ratio": _divide(buffers, weights),
        "weights_memory_ratio": _divide(
            _instant_max(d, "llmb_engine_process_gpu_memory_bytes"), weights
        ),
        "kv_usage_avg": _avg_max(d, "llmb_engine_kv_cache_usage_ratio", qw),
        "waiting_avg": _avg_max(d, "llmb_engine_requests_waiting", qw),
        "kv_pressure_increase": _sum_of_max(
            ((_key(lab), lab.get("event", "")), inc)
            for lab, pts in d.range("llmb_engine_kv_pressure_events_total", rw)
            if (inc := _extrapolated(pts, d.at, rw, rate=False)) is not None
        ),
        "running": _instant_max(d, "llmb_engine_requests_running"),
        "waiting": _instant_max(d, "llmb_engine_requests_waiting"),
        **admission_values(d),
        "generation_tokens_per_second": _rate_max(d, "llmb_engine_generation_tokens_total", rw),
        "experts_host_layers": _instant_max(d, "llmb_engine_experts_host_layers"),
        **_card().card_values(d),
        **prefill_values(d),
    }


def _card() -> ModuleType:
    """core.card_rules (the card's state, issue 27): it builds on this module's helpers, so
    it is imported once this module is complete."""
    import core.card_rules

    return core.card_rules


@dataclass
class _Decode:
    """The decode/roofline inputs per engine."""

    rate: dict[EngineKey, float]
    bandwidth: dict[EngineKey, float]
    kv_tokens: dict[EngineKey, float]
    kv_bytes_per_token: dict[EngineKey, float]
    running_avg: dict[EngineKey, float]
    accept: dict[EngineKey, float]
    host_bytes: dict[EngineKey, float]
    structure: dict[str, dict[EngineKey, float]]

    @classmethod
    def read(cls, d: _Data) -> _Decode:
        rw = threshold_seconds("rate_window")
        return cls(
            rate=_divide(
                _rate_max(d, "llmb_engine_decode_tokens_total", rw),
                _rate_max(d, "llmb_engine_decode_seconds_total", rw),
            ),
            bandwidth=_bandwidth(d),
            kv_tokens=_avg_max(d, "llmb_engine_kv_cache_used_tokens", rw),
            kv_bytes_per_token=_instant_max(d, "llmb_model_kv_bytes_per_token_estimated"),
            running_avg=_avg_max(d, "llmb_engine_requests_running", rw),
            accept=_instant_max(d, "llmb_engine_spec_accept_length"),
            host_bytes=_instant_max(d, "llmb_engine_experts_host_bytes"),
            structure={f: _instant_max(d, name) for f, name in STRUCTURE_SERIES.items()},
        )

    def values(self, key: EngineKey, fields: dict[str, object]) -> RuleValues:
        """One engine's rule values, its Signals built from `fields` plus decode efficiency."""
        batch = decode_batch(self.running_avg.get(key))
        model = ModelStructure(**{f: v.get(key) for f, v in self.structure.items()})
        accept = self.accept.get(key)
        active = bytes_step = None
        if model.structure_known or model.weights_bytes is not None:
            active = active_weights_bytes(model, batch)
            bytes_step = decode_bytes_per_step(
                model, self.kv_tokens.get(key), self.kv_bytes_per_token.get(key), batch, accept
            )
        bandwidth = self.bandwidth.get(key)
        roofline = roofline_tokens_per_second(bandwidth, bytes_step, accept)
        efficiency = decode_efficiency(self.rate.get(key), roofline)
        reason = roofline_misfit(efficiency, roofline_facts(model, accept))
        return RuleValues(
            Signals(**fields, decode_efficiency=efficiency),  # type: ignore[arg-type]
            self.rate.get(key),
            bandwidth,
            bytes_step,
            roofline,
            decode_batch=batch,
            active_weights_bytes=active,
            accepted_tokens_per_step=accepted_tokens(accept),
            misfit=reason.name if reason is not None else None,
            experts_host_bound_tokens_per_second=experts_host_bound(
                self.host_bytes.get(key), model.experts, model.experts_used, batch
            ),
        )


def rule_values_at(series: Mapping[SeriesKey, Points], at: float) -> dict[EngineKey, RuleValues]:
    """The recording rules' per-engine values at `at` (unix seconds) for every engine up."""
    d = _Data(series, at)
    up = {k for k, v in _instant_max(d, "llmb_engine_up").items() if v == 1}
    gpu_hosts = {lab.get("host", "") for lab, _ in d.instant("llmb_gpu_memory_total_bytes")}
    signals = _signal_values(d)
    decode = _Decode.read(d)
    out: dict[EngineKey, RuleValues] = {}
    for key in sorted(up):
        fields: dict[str, object] = {name: v.get(key) for name, v in signals.items()}
        fields["host_has_gpu"] = key.host in gpu_hosts
        out[key] = decode.values(key, fields)
    return out


def verdicts_at(series: Mapping[SeriesKey, Points], at: float) -> dict[EngineKey, Verdict]:
    """The verdict of every engine up at `at`: `evaluate` of its rule values' signals."""
    return {k: evaluate(v.signals) for k, v in rule_values_at(series, at).items()}
