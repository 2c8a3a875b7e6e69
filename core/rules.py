"""The recording rules' arithmetic over raw samples (what promtool computes), in Python.

From raw samples
    (`core.promql`'s `SeriesKey`, `EngineKey` and `series_from_scrapes`)
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

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from config.kinds import engine_kind, kinds
from core import series as llmb
from core.card import shortfall_explained
from core.card_rules import card_values, memory_clock_ratio
from core.conditions import Verdict, evaluate
from core.prefill_rules import measured_tokens_per_second, prefill_values
from core.promql import (
    Data,
    EngineKey,
    Points,
    SeriesKey,
    avg_max,
    divide,
    engine_gpus,
    engine_key,
    extrapolated,
    instant_max,
    max_by,
    not_cpu,
    peak_max,
    rate_max,
    sum_of_device_max,
    sum_of_max,
)
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
)
from core.signals import Signals
from core.thresholds import threshold_seconds


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
    # Prompt tokens computed / the wall time prefill ran (`core.prefill`): the prefill figure.
    prefill_tokens_per_second: float | None = None


def _preallocates_kv(lab: Mapping[str, str]) -> bool:
    """The engine's kind preallocates its KV pool (config/kinds.py `kv_pool_preallocated`)."""
    kind = lab.get("kind", "")
    return kind in kinds() and engine_kind(kind).kv_pool_preallocated


def admission_values(d: Data) -> dict[str, dict[EngineKey, float]]:
    """The admission and SGLang-residency signals per engine (Signals field -> values).

    The same arithmetic, in the same order, as their recording rules (mixin/rules/recording.py
    `admission_rules`): running against its cap, the KV the running requests plus one more
    would need against the pool, and SGLang's process GPU memory beyond its KV pool. Peaks
    over `queue_window`, not averages: the pool binds at its fullest moment, and averages
    count the gaps between one request's end and the next one's admission.
    """
    qw, rw = threshold_seconds("queue_window"), threshold_seconds("rate_window")
    peak = peak_max(d, llmb.ENGINE_REQUESTS_RUNNING, qw)
    slots = instant_max(d, llmb.ENGINE_SLOTS)
    capacity = instant_max(d, llmb.ENGINE_KV_CACHE_CAPACITY_TOKENS)
    held = peak_max(d, llmb.ENGINE_KV_CACHE_USED_TOKENS, qw)
    prompt = rate_max(d, llmb.ENGINE_PROMPT_TOKENS_TOTAL, rw)
    generated = rate_max(d, llmb.ENGINE_GENERATION_TOKENS_TOTAL, rw)
    finished = rate_max(d, llmb.ENGINE_REQUESTS_FINISHED_TOTAL, rw)
    out: dict[str, dict[EngineKey, float]] = {
        "running_slots_ratio": divide(peak, slots),
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
    sglang = _preallocates_kv
    process = instant_max(d, llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES, sglang)
    reported = sum_of_device_max(
        d, llmb.ENGINE_KV_CACHE_BYTES, lambda lab: sglang(lab) and not_cpu(lab)
    )
    estimated = instant_max(d, llmb.MODEL_KV_CACHE_BYTES_ESTIMATED, sglang)
    weights = instant_max(d, llmb.MODEL_WEIGHTS_BYTES)
    for key, mem in process.items():
        kv = reported.get(key, estimated.get(key))
        w = weights.get(key)
        if kv is not None and w is not None and w > 0:
            out["weights_memory_beyond_kv_ratio"][key] = (mem - kv) / w
    return out


def _bandwidth(d: Data) -> dict[EngineKey, float]:
    """Each engine's bandwidth, scaled by the memory clock the window reached (1: unknown)."""
    named = d.instant(llmb.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND)
    gpu_bw = max_by(((lab.get("host", ""), lab.get("gpu", "")), v) for lab, v in named)
    clock = memory_clock_ratio(d)
    return engine_gpus(d, {k: bw * clock.get(k, 1.0) for k, bw in gpu_bw.items()})


# ModelStructure field -> its series (diagnose reads the same series into its results).
STRUCTURE_SERIES = llmb.field_series(*(f.name for f in fields(ModelStructure)))


def _signal_values(d: Data) -> dict[str, dict[EngineKey, float]]:
    """The Signals fields that are one recording rule each (field -> values per engine)."""
    rw, qw = threshold_seconds("rate_window"), threshold_seconds("queue_window")
    weights = instant_max(d, llmb.MODEL_WEIGHTS_BYTES)
    on_gpu = sum_of_device_max(d, llmb.ENGINE_MODEL_BUFFER_BYTES, not_cpu)
    # Only host buffers reported (a CPU build, `-ngl 0`): 0 on the GPU, not an absent series.
    buffers = {k: on_gpu.get(k, 0.0) for k in instant_max(d, llmb.ENGINE_MODEL_BUFFER_BYTES)}
    return {
        "layers_ratio": divide(
            instant_max(d, llmb.ENGINE_GPU_LAYERS_OFFLOADED),
            instant_max(d, llmb.ENGINE_GPU_LAYERS_TOTAL),
        ),
        "weights_buffers_ratio": divide(buffers, weights),
        "weights_memory_ratio": divide(
            instant_max(d, llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES), weights
        ),
        "kv_usage_avg": avg_max(d, llmb.ENGINE_KV_CACHE_USAGE_RATIO, qw),
        "waiting_avg": avg_max(d, llmb.ENGINE_REQUESTS_WAITING, qw),
        "kv_pressure_increase": sum_of_max(
            ((engine_key(lab), lab.get("event", "")), inc)
            for lab, pts in d.range(llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL, rw)
            if (inc := extrapolated(pts, d.at, rw, rate=False)) is not None
        ),
        "running": instant_max(d, llmb.ENGINE_REQUESTS_RUNNING),
        "waiting": instant_max(d, llmb.ENGINE_REQUESTS_WAITING),
        **admission_values(d),
        "generation_tokens_per_second": rate_max(d, llmb.ENGINE_GENERATION_TOKENS_TOTAL, rw),
        "experts_host_layers": instant_max(d, llmb.ENGINE_EXPERTS_HOST_LAYERS),
        **card_values(d),
        **prefill_values(d),
    }


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


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
    # Host memory bandwidth per host (`max by (host)`): the exporter's measurement or flag.
    host_bandwidth: dict[str, float]
    structure: dict[str, dict[EngineKey, float]]

    @classmethod
    def read(cls, d: Data) -> _Decode:
        rw = threshold_seconds("rate_window")
        return cls(
            rate=divide(
                rate_max(d, llmb.ENGINE_DECODE_TOKENS_TOTAL, rw),
                rate_max(d, llmb.ENGINE_DECODE_SECONDS_TOTAL, rw),
            ),
            bandwidth=_bandwidth(d),
            kv_tokens=avg_max(d, llmb.ENGINE_KV_CACHE_USED_TOKENS, rw),
            kv_bytes_per_token=instant_max(d, llmb.MODEL_KV_BYTES_PER_TOKEN_ESTIMATED),
            running_avg=avg_max(d, llmb.ENGINE_REQUESTS_RUNNING, rw),
            accept=instant_max(d, llmb.ENGINE_SPEC_ACCEPT_LENGTH),
            host_bytes=instant_max(d, llmb.ENGINE_EXPERTS_HOST_BYTES),
            host_bandwidth=max_by(
                (lab.get("host", ""), v)
                for lab, v in d.instant(llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND)
            ),
            structure={f: instant_max(d, name) for f, name in STRUCTURE_SERIES.items()},
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
        explained = shortfall_explained(
            _number(fields.get("sm_clock_ratio")),
            efficiency,
            _number(fields.get("prefill_efficiency")),
            _number(fields.get("memory_clock_ratio")),
            _number(fields.get("prompt_tokens_mean")),
        )
        return RuleValues(
            Signals(**fields, decode_efficiency=efficiency, card_shortfall_explained=explained),  # type: ignore[arg-type]
            self.rate.get(key),
            bandwidth,
            bytes_step,
            roofline,
            decode_batch=batch,
            active_weights_bytes=active,
            accepted_tokens_per_step=accepted_tokens(accept),
            misfit=reason.name if reason is not None else None,
            experts_host_bound_tokens_per_second=experts_host_bound(
                self.host_bytes.get(key),
                model.experts,
                model.experts_used,
                batch,
                self.host_bandwidth.get(key.host),
            ),
        )


def rule_values_at(series: Mapping[SeriesKey, Points], at: float) -> dict[EngineKey, RuleValues]:
    """The recording rules' per-engine values at `at` (unix seconds) for every engine up."""
    d = Data(series, at)
    up = {k for k, v in instant_max(d, llmb.ENGINE_UP).items() if v == 1}
    gpu_hosts = {lab.get("host", "") for lab, _ in d.instant(llmb.GPU_MEMORY_TOTAL_BYTES)}
    signals = _signal_values(d)
    decode = _Decode.read(d)
    prefill = measured_tokens_per_second(d)
    out: dict[EngineKey, RuleValues] = {}
    for key in sorted(up):
        fields: dict[str, object] = {name: v.get(key) for name, v in signals.items()}
        fields["host_has_gpu"] = key.host in gpu_hosts
        out[key] = replace(decode.values(key, fields), prefill_tokens_per_second=prefill.get(key))
    return out


def verdicts_at(series: Mapping[SeriesKey, Points], at: float) -> dict[EngineKey, Verdict]:
    """The verdict of every engine up at `at`: `evaluate` of its rule values' signals."""
    return {k: evaluate(v.signals) for k, v in rule_values_at(series, at).items()}
