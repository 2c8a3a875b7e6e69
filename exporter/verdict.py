"""The decision core: thresholds, verdicts and their conditions, and the decode roofline.

Every surface that names a bottleneck takes it from here: the Prometheus rules
(`prometheus/generate.py` renders them from `CONDITIONS`, `VERDICTS` and `THRESHOLDS`),
`prometheus/thresholds.md`, the verdict table in `docs/diagnose.md`, and `llmb-loadgen
diagnose` / `compare` (which call `evaluate`). `tests/test_verdict_parity.py` feeds the same
samples to `evaluate` and to promtool and requires the same verdict.

Public API
----------
Thresholds
    `Threshold`, `THRESHOLDS` (name -> value as PromQL text, unit, why), `t(name)` (the
    PromQL text), `number(name)` (a ratio/requests/bytes threshold as a float),
    `seconds(name)` (a range/duration threshold in seconds).
Verdicts
    `VERDICTS` (names in decision order), `VERDICT_INFO` (name -> `VerdictInfo`: the
    condition that decides it, summary, action, fleet severity), `SEVERITY`.
Conditions
    `CONDITIONS` (in decision order, each a `Condition` built from `Evidence` alternatives
    of `Compare` / `AllOf` tests on `Signals` fields). `SIGNAL_RECORDS` maps each
    `Signals` field to the recorded series the rules read it from.
Evaluation
    `Signals` (the recording-rule-level inputs; `None` = the series is absent),
    `evaluate(signals) -> Verdict` (`.name`, `.conditions`, `.evidence`, `.info`),
    `ConditionResult`.
Roofline
    `decode_bytes_per_step(weights, kv_tokens, kv_bytes_per_token)`,
    `roofline_tokens_per_second(bandwidth, bytes_per_step)`,
    `decode_efficiency(decode_tokens_per_second, roofline)`.
From raw samples
    `SeriesKey` (metric name, sorted label pairs), `EngineKey` (host, engine, kind),
    `series_from_scrapes(scrapes)`, `signals_at(series, at) -> {EngineKey: Signals}`,
    `verdicts_at(series, at) -> {EngineKey: Verdict}` and
    `rule_values_at(series, at) -> {EngineKey: RuleValues}` (also the decode rate,
    bandwidth, bytes per step and roofline): the same arithmetic as the recording rules
    (rate/increase with Prometheus' extrapolation, avg_over_time, max by engine, the GPU
    joins) at time `at`, with Prometheus 2.x window semantics (a range `[w]` holds the
    samples in `[at - w, at]`, an instant lookup takes the newest sample of the last 5
    minutes). This is what promtool computes when the rule groups run in file order
    (`group_eval_order`); a running Prometheus evaluates its groups independently, so
    there the verdict may trail the raw series by up to one evaluation interval per group.

Absence mirrors PromQL: a comparison on an absent signal is absent, `AllOf` is absent when
one part is, an `Evidence` alternative that is absent does not count, and a condition with
every alternative absent is false (the rules' `or 0 * up`).
"""

from __future__ import annotations

import math
import operator
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

# --------------------------------------------------------------------------- thresholds


@dataclass(frozen=True)
class Threshold:
    """One tunable number of the rules and why it has its value."""

    value: str
    unit: str
    why: str


THRESHOLDS: dict[str, Threshold] = {
    "rate_window": Threshold(
        "5m",
        "range",
        "Window of every rate over token/time counters. llama.cpp adds generated tokens and "
        "decode time only when a request ends, so the window must span several request "
        "durations (a 512-token answer at 10 tok/s takes ~50 s); 5m also sets how long a "
        "KV-pressure event keeps `kv_saturated` and how long after the last finished request "
        "an engine still counts as busy rather than idle.",
    ),
    "queue_window": Threshold(
        "1m",
        "range",
        "Window for the average queue length and KV usage behind the verdict. The gauges "
        "flicker as requests start and end; a minute is long enough to smooth that and short "
        "enough to follow a load step.",
    ),
    "kv_usage_high": Threshold(
        "0.9",
        "ratio",
        "KV cache usage at or above which the KV pool counts as full. SGLang admits new "
        "requests against a reserve of future tokens (`new_token_ratio`), so a queue with "
        "usage above 0.9 means admission is blocked by KV; vLLM's KV dashboard turns "
        "orange at the same figure.",
    ),
    "queue_min": Threshold(
        "0.5",
        "requests",
        "Average number of waiting requests over `queue_window` at or above which requests "
        "count as queueing: a request waits at least half of the time.",
    ),
    # --- admission on SGLang: which limit binds while requests wait (issue 18) ------------
    "slots_full_ratio": Threshold(
        "0.9",
        "ratio",
        "Peak running requests over `queue_window` / the engine's cap (llama.cpp `-np`, "
        "SGLang `max_running_requests`) at or above which the cap is what requests wait "
        "for. The peak, not the average: between two requests the count dips while the "
        "queue refills the slot. Below it requests wait for something else (KV pool, "
        "prefill): raising the cap would change nothing.",
    ),
    "kv_demand_full": Threshold(
        "1",
        "ratio",
        "KV tokens the running requests plus one more would need / the pool's capacity at or "
        "above which the pool cannot admit the next request: SGLang admits only what its "
        "token pool can hold (prompt plus a reserve for the answer), so requests wait while "
        "running stays below the cap and `token_usage` below `kv_usage_high` (one long "
        "request can take most of a small pool).",
    ),
    "weights_memory_ratio_min": Threshold(
        "0.9",
        "ratio",
        "Engine process GPU memory / model weight bytes below which the weights cannot all be "
        "on the GPU. Measured on an H200 with a 15.2 GB Gemma-3-27B-shaped Q4_0 model: 1.14 "
        "with all 63 layers on the GPU, 0.57 with 30 of 63; 0.9 leaves room for tensors "
        "llama.cpp keeps in host memory (token embeddings) while catching any real offload.",
    ),
    "weights_buffer_ratio_min": Threshold(
        "0.9",
        "ratio",
        "Weight buffers the engine reports on a GPU (llama.cpp `CUDA0 model buffer size`, "
        "SGLang `weight_memory_usage_gb`) / model weight bytes below which weights sit in host "
        "memory. Unlike process memory this is not inflated by the KV pool, so it also catches "
        "a small offload next to a large KV cache. H200 capture: 14,493 MiB of 15.2 GB on "
        "CUDA0 with all layers (1.00), 7,182 MiB with 30 of 63 (0.49).",
    ),
    "layers_ratio_min": Threshold(
        "1",
        "ratio",
        "Layers on the GPU / layers of the model (llama.cpp log) below which the weights are "
        "not resident: one layer on the CPU already makes every decode step wait for it.",
    ),
    "decode_efficiency_at_limit": Threshold(
        "0.5",
        "ratio",
        "Measured per-sequence decode tok/s / roofline (GPU memory bandwidth / bytes read per "
        "decode step) at or above which decode is at the card's limit. The roofline uses the "
        "theoretical peak bandwidth, which tuned memory-bound kernels reach to 60-90 %; at "
        "half of it the card is the limit, below it the engine or its settings leave speed "
        "unused (llama.cpp Q4_0 on an H200 measured 0.30: 94.8 tok/s against 316).",
    ),
    "decode_efficiency_physical_max": Threshold(
        "1.1",
        "ratio",
        "Decode efficiency above which the bytes-per-step model does not fit the measurement: "
        "no engine decodes faster than its memory-bandwidth bound, so a higher figure means "
        "the roofline counts bytes the engine does not read (a mixture-of-experts model "
        "without expert metadata, speculative decoding not detected) or a wrong bandwidth. "
        "10 % covers the bandwidth table's rounding, L2-cache hits and timer resolution. "
        "Above it no decode verdict is claimed and `llmb:engine_roofline:misfit` names the "
        "likely cause.",
    ),
    "host_memory_bandwidth_bytes_per_second": Threshold(
        "1e+11",
        "bytes/s",
        "Host memory bandwidth for the bound of expert offload (llama.cpp `--n-cpu-moe`, "
        "`-ot exps=CPU`). At decode batch sizes below 32 llama.cpp computes the experts that "
        "live in host memory on the CPU, which reads them from host DRAM (PCIe carries them "
        "only for larger batches, `op_offload`); 100 GB/s is a server socket's DDR5 in "
        "practice (8 x DDR5-4800 peaks at 307 GB/s, desktops reach 60-90 GB/s). Nothing "
        "measures it: the bound is a ceiling for the advice, never a verdict.",
    ),
    "gpu_headroom_min_bytes": Threshold(
        "536870912",
        "bytes",
        "Free GPU memory at the windowed peak (total - reserved - peak used) below which the "
        "card is near full (512 MiB): less than one compute buffer or CUDA graph of a 27B "
        "model. Engines preallocate by design (SGLang `--mem-fraction-static`, llama.cpp "
        "`--fit` leaves 1 GiB), so a ratio of used memory would fire on healthy setups.",
    ),
    "for_kv_saturated": Threshold(
        "1m", "duration", "`for:` of LLMKVCacheSaturated (its signal is already a 1m average)."
    ),
    "for_weights_not_resident": Threshold(
        "2m", "duration", "`for:` of LLMWeightsNotResident (lets process memory settle after load)."
    ),
    "for_gpu_memory_near_full": Threshold(
        "5m",
        "duration",
        "`for:` of LLMGPUMemoryNearFull (peak over the sampler window, sustained).",
    ),
    "for_requests_queueing": Threshold(
        "5m", "duration", "`for:` of LLMRequestsQueueing (a short burst queueing is normal)."
    ),
    "for_decode_below_card_limit": Threshold(
        "10m", "duration", "`for:` of LLMDecodeBelowCardLimit (informational; steady state only)."
    ),
    "for_roofline_misfit": Threshold(
        "10m",
        "duration",
        "`for:` of LLMRooflineMisfit (steady state only, as LLMDecodeBelowCardLimit).",
    ),
    "for_engine_down": Threshold(
        "1m", "duration", "`for:` of LLMEngineDown (not while the engine reports loading)."
    ),
    "for_exporter_down": Threshold(
        "1m", "duration", "`for:` of LLMExporterDown (every other alert is blind without it)."
    ),
    "for_source_failing": Threshold(
        "5m", "duration", "`for:` of LLMExporterSourceFailing (one bad scrape is not a failure)."
    ),
    "for_token_count_mismatch": Threshold(
        "1m", "duration", "`for:` of LLMTokenCountMismatch (the load generator's verdict is final)."
    ),
}

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def t(name: str) -> str:
    """The value of one threshold as it appears in PromQL."""
    return THRESHOLDS[name].value


def number(name: str) -> float:
    """A ratio, request-count or byte threshold as a float (as PromQL parses it)."""
    th = THRESHOLDS[name]
    if th.unit in ("range", "duration"):
        raise ValueError(f"threshold {name!r} is a {th.unit}; use seconds()")
    return float(th.value)


def seconds(name: str) -> float:
    """A range or duration threshold (`5m`, `1h30m`) in seconds."""
    text = t(name)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"threshold {name!r} = {text!r} is not a duration")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


# ------------------------------------------------------------------------------ signals


@dataclass(frozen=True)
class Signals:
    """The recording-rule-level inputs of the verdict for one engine that is up.

    `None` means the series is absent (as in PromQL: no data, or a zero denominator).
    """

    # engine:llmb_gpu_layers_offloaded:ratio: layers on the GPU / layers of the model
    layers_ratio: float | None = None
    # engine:llmb_weights_gpu_buffers:ratio: weight buffers on a GPU / weight bytes
    weights_buffers_ratio: float | None = None
    # engine:llmb_weights_gpu_memory:ratio: engine process GPU memory / weight bytes
    weights_memory_ratio: float | None = None
    # the engine's host exports llmb_gpu_memory_total_bytes (it has a GPU at all)
    host_has_gpu: bool = False
    # engine:llmb_kv_cache_usage:avg<queue_window>
    kv_usage_avg: float | None = None
    # engine:llmb_requests_waiting:avg<queue_window>
    waiting_avg: float | None = None
    # engine:llmb_kv_pressure_events:increase<rate_window> (all event kinds summed)
    kv_pressure_increase: float | None = None
    # engine:llmb_requests_running:max / engine:llmb_requests_waiting:max (now)
    running: float | None = None
    waiting: float | None = None
    # --- admission and SGLang residency (issue 18) ---
    # engine:llmb_requests_running_slots:ratio: peak running <queue_window> / the running cap
    running_slots_ratio: float | None = None
    # engine:llmb_kv_demand_held:ratio: peak KV held x (peak running + 1) / peak running
    # / capacity (<queue_window>)
    kv_demand_held_ratio: float | None = None
    # engine:llmb_kv_demand_finished:ratio: (peak running + 1) x tokens per finished request
    # / capacity
    kv_demand_finished_ratio: float | None = None
    # engine:llmb_weights_gpu_memory_beyond_kv:ratio (SGLang): (process GPU memory - KV pool)
    # / weight bytes
    weights_memory_beyond_kv_ratio: float | None = None
    # engine:llmb_generation_tokens_per_second:rate<rate_window>
    generation_tokens_per_second: float | None = None
    # engine:llmb_decode_efficiency:ratio<rate_window>: per-sequence decode tok/s / roofline
    decode_efficiency: float | None = None
    # engine:llmb_experts_host_layers:max: layers whose routed experts live in host memory
    experts_host_layers: float | None = None


SIGNAL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Signals))


def _records() -> dict[str, str]:
    rw, qw = t("rate_window"), t("queue_window")
    return {
        "layers_ratio": "engine:llmb_gpu_layers_offloaded:ratio",
        "weights_buffers_ratio": "engine:llmb_weights_gpu_buffers:ratio",
        "weights_memory_ratio": "engine:llmb_weights_gpu_memory:ratio",
        "kv_usage_avg": f"engine:llmb_kv_cache_usage:avg{qw}",
        "waiting_avg": f"engine:llmb_requests_waiting:avg{qw}",
        "kv_pressure_increase": f"engine:llmb_kv_pressure_events:increase{rw}",
        "running": "engine:llmb_requests_running:max",
        "waiting": "engine:llmb_requests_waiting:max",
        "running_slots_ratio": "engine:llmb_requests_running_slots:ratio",
        "kv_demand_held_ratio": "engine:llmb_kv_demand_held:ratio",
        "kv_demand_finished_ratio": "engine:llmb_kv_demand_finished:ratio",
        "weights_memory_beyond_kv_ratio": "engine:llmb_weights_gpu_memory_beyond_kv:ratio",
        "generation_tokens_per_second": f"engine:llmb_generation_tokens_per_second:rate{rw}",
        "decode_efficiency": f"engine:llmb_decode_efficiency:ratio{rw}",
        "experts_host_layers": "engine:llmb_experts_host_layers:max",
    }


# Signals field -> the recorded series (prometheus/rules/recording.yml) the rules read it
# from. `host_has_gpu` has none: the rules test `llmb_gpu_memory_total_bytes` directly.
SIGNAL_RECORDS: dict[str, str] = _records()

# ---------------------------------------------------------------------------- conditions

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Compare:
    """`signal OP threshold` (PromQL `record OP bool threshold`).

    `threshold` names a `THRESHOLDS` entry or is a number literal. `absent_holds`: an
    absent signal counts as the comparison holding (PromQL `(x OP bool v or up)`).
    """

    signal: str
    op: str
    threshold: str
    absent_holds: bool = False

    @property
    def value(self) -> float:
        """The threshold as a float."""
        return number(self.threshold) if self.threshold in THRESHOLDS else float(self.threshold)

    @property
    def promql_threshold(self) -> str:
        """The threshold as PromQL text."""
        return t(self.threshold) if self.threshold in THRESHOLDS else self.threshold

    def test(self, signals: Signals) -> bool | None:
        """True/False, or None when the signal is absent."""
        value = getattr(signals, self.signal)
        if value is None:
            return True if self.absent_holds else None
        return _OPS[self.op](float(value), self.value)


@dataclass(frozen=True)
class AllOf:
    """Every comparison holds (PromQL: the `bool` results multiplied); absent if one is."""

    parts: tuple[Compare, ...]

    def test(self, signals: Signals) -> bool | None:
        results = [p.test(signals) for p in self.parts]
        if any(r is None for r in results):
            return None
        return all(results)


@dataclass(frozen=True)
class Evidence:
    """One alternative way a condition can hold, named by its `evidence` label."""

    label: str
    test: Compare | AllOf
    text: str
    # What to do when this alternative holds, where it says more than the verdict's action.
    action: str | None = None


@dataclass(frozen=True)
class Condition:
    """A 0/1 decision input, recorded as `engine:llmb_<name>:bool` for every engine up.

    It holds when any `alternatives` entry holds (absent ones do not count) and, with
    `needs_gpu`, only on a host that has a GPU.
    """

    name: str
    alternatives: tuple[Evidence, ...]
    needs_gpu: bool = False

    @property
    def record(self) -> str:
        """The recorded series name."""
        return f"engine:llmb_{self.name}:bool"

    def evaluate(self, signals: Signals) -> ConditionResult:
        """Which alternatives hold, and whether the condition does."""
        held = tuple(e.label for e in self.alternatives if e.test.test(signals))
        ok = bool(held) and (signals.host_has_gpu or not self.needs_gpu)
        return ConditionResult(self.name, ok, held if ok else ())


@dataclass(frozen=True)
class ConditionResult:
    """One condition evaluated: whether it held and the evidence labels that did."""

    name: str
    held: bool
    evidence: tuple[str, ...]


# --- admission on SGLang (issue 18): the limit that binds while requests wait -------------
POOL_ACTION = (
    "The KV pool, not the running-request cap, limits admission: give it more tokens (SGLang "
    "a higher `--mem-fraction-static`, or a larger or no `--max-total-tokens`; llama.cpp a "
    "larger `-c`), store it smaller (`--kv-cache-dtype fp8_e5m2`, `-ctk q8_0 -ctv q8_0`), "
    "or send shorter requests (prompt + max_tokens)."
)
SLOTS_FULL_ACTION = (
    "Running requests sit at their cap: let more run at once (SGLang "
    "`--max-running-requests`, llama.cpp `-np` with `-c` raised so each slot keeps its "
    "context); check the KV cache still has room afterwards."
)
PREFILL_ACTION = (
    "Requests wait for prefill while running stays below its cap and the KV pool has room: "
    "prefill more per step (SGLang a larger `--chunked-prefill-size` or "
    "`--max-prefill-tokens`, llama.cpp larger `-b`/`-ub`) or send shorter prompts."
)


def _waiting_below_cap(*more: Compare) -> AllOf:
    """Requests queue while running stays below its cap, and `more`."""
    return AllOf(
        (
            Compare("waiting_avg", ">=", "queue_min"),
            Compare("running_slots_ratio", "<", "slots_full_ratio"),
            *more,
        )
    )


CONDITIONS: tuple[Condition, ...] = (
    Condition(
        "weights_not_resident",
        (
            Evidence(
                "layers",
                Compare("layers_ratio", "<", "layers_ratio_min"),
                "fewer layers on the GPU than the model has",
            ),
            Evidence(
                "buffers",
                Compare("weights_buffers_ratio", "<", "weights_buffer_ratio_min"),
                "GPU weight buffers below `weights_buffer_ratio_min` x weight bytes",
            ),
            Evidence(
                "memory_beyond_kv",
                Compare("weights_memory_beyond_kv_ratio", "<", "weights_memory_ratio_min"),
                "SGLang: engine process GPU memory minus its KV pool (reported, else "
                "`max_total_num_tokens` x KV bytes per token) below `weights_memory_ratio_min` "
                "x weight bytes",
            ),
            Evidence(
                "memory",
                Compare("weights_memory_ratio", "<", "weights_memory_ratio_min"),
                "engine process GPU memory below `weights_memory_ratio_min` x weight bytes",
            ),
            Evidence(
                "experts_host",
                Compare("experts_host_layers", ">", "0"),
                "routed experts of some layers kept in host memory (llama.cpp `--n-cpu-moe`, "
                "`--cpu-moe`, `-ot exps=CPU`)",
            ),
        ),
        needs_gpu=True,
    ),
    Condition(
        "kv_saturated",
        (
            Evidence(
                "usage_and_queue",
                AllOf(
                    (
                        Compare("kv_usage_avg", ">=", "kv_usage_high"),
                        Compare("waiting_avg", ">=", "queue_min"),
                    )
                ),
                "KV usage >= `kv_usage_high` with >= `queue_min` requests waiting "
                "(averages over `queue_window`)",
            ),
            Evidence(
                "pressure_events",
                Compare("kv_pressure_increase", ">", "0"),
                "any KV-pressure event (KV full, context shift/exceeded, truncation, "
                "retraction) in `rate_window`",
            ),
            Evidence(
                "pool_held",
                _waiting_below_cap(Compare("kv_demand_held_ratio", ">=", "kv_demand_full")),
                ">= `queue_min` requests waiting while running peaks below `slots_full_ratio` "
                "of its cap, and the KV the running requests hold at the pool's fullest plus one "
                "more of their size "
                "reaches `kv_demand_full` x the pool",
                POOL_ACTION,
            ),
            Evidence(
                "pool_reserved",
                _waiting_below_cap(Compare("kv_demand_finished_ratio", ">=", "kv_demand_full")),
                ">= `queue_min` requests waiting while running peaks below `slots_full_ratio` "
                "of its cap, and (peak running + 1) x the tokens of a finished request (prompt + "
                "answer, `rate_window`) reaches `kv_demand_full` x the pool",
                POOL_ACTION,
            ),
        ),
    ),
    Condition(
        "requests_queueing",
        (
            Evidence(
                "queue",
                Compare("waiting_avg", ">=", "queue_min"),
                ">= `queue_min` requests waiting (average over `queue_window`)",
            ),
            Evidence(
                "slots_full",
                AllOf(
                    (
                        Compare("waiting_avg", ">=", "queue_min"),
                        Compare("running_slots_ratio", ">=", "slots_full_ratio"),
                    )
                ),
                "with running peaking at `slots_full_ratio` or more of its cap (`queue_window`)",
                SLOTS_FULL_ACTION,
            ),
            Evidence(
                "prefill",
                _waiting_below_cap(),
                "with running peaking below `slots_full_ratio` of its cap (and the KV pool not "
                "the limit: then `kv_saturated` holds first)",
                PREFILL_ACTION,
            ),
        ),
    ),
    Condition(
        "idle",
        (
            Evidence(
                "no_work",
                AllOf(
                    (
                        Compare("running", "==", "0"),
                        Compare("waiting", "==", "0"),
                        Compare("generation_tokens_per_second", "==", "0", absent_holds=True),
                    )
                ),
                "nothing running, nothing waiting, no tokens generated in `rate_window`",
            ),
        ),
    ),
    Condition(
        "decode_at_card_limit",
        (
            Evidence(
                "efficiency",
                AllOf(
                    (
                        Compare("decode_efficiency", ">=", "decode_efficiency_at_limit"),
                        # No answer beyond physics: above this the roofline does not fit.
                        Compare("decode_efficiency", "<=", "decode_efficiency_physical_max"),
                    )
                ),
                "decode efficiency (per-sequence decode tok/s / roofline) >= "
                "`decode_efficiency_at_limit` and <= `decode_efficiency_physical_max` "
                "(above it the bytes-per-step model does not fit the measurement: "
                "`llmb:engine_roofline:misfit` says why, and no decode claim is made)",
            ),
        ),
    ),
)
CONDITION_BY_NAME: dict[str, Condition] = {c.name: c for c in CONDITIONS}

# ------------------------------------------------------------------------------ verdicts


@dataclass(frozen=True)
class VerdictInfo:
    """One verdict: the condition that decides it (None: the fallback), what it means,
    what to do, and its fleet severity (higher is worse)."""

    name: str
    condition: str | None
    summary: str
    action: str
    severity: int


# Decision order: the first verdict whose condition holds wins.
VERDICTS: tuple[str, ...] = (
    "weights_not_resident",
    "kv_saturated",
    "scheduling_bound",
    "idle",
    "decode_at_card_limit",
    "decode_below_card_limit",
)

VERDICT_INFO: dict[str, VerdictInfo] = {
    v.name: v
    for v in (
        VerdictInfo(
            "weights_not_resident",
            "weights_not_resident",
            "Part of the model's weights is not on the GPU: every decode step waits for the "
            "part in host memory.",
            "Put every layer on the GPU: llama.cpp `-ngl 999` (and `--fit off` if the automatic "
            "fit lowered `-ngl`), SGLang without `--cpu-offload-gb`. If the weights do not fit, "
            "free memory for them with a shorter context (`-c`, `--context-length`), a "
            "quantized KV cache (`-ctk q8_0 -ctv q8_0`) or a smaller quantization.",
            6,
        ),
        VerdictInfo(
            "kv_saturated",
            "kv_saturated",
            "The KV cache is full: requests wait for KV space or are cut (context shift, "
            "truncation, context exceeded, retraction).",
            "Give the KV cache room: a larger context per slot (llama.cpp `-c` with `-np`, "
            "or `--kv-unified`; SGLang `--mem-fraction-static`), a quantized KV cache "
            "(llama.cpp `-ctk q8_0 -ctv q8_0`, SGLang `--kv-cache-dtype fp8_e5m2`), or fewer "
            "or shorter requests at once.",
            5,
        ),
        VerdictInfo(
            "scheduling_bound",
            "requests_queueing",
            "Requests queue while the KV cache has room: the number of slots or running "
            "requests, or prefill, is the limit, not memory.",
            "Find the limit that binds: with running requests at their cap let more run at "
            "once (llama.cpp `-np` with `-c` raised so each slot keeps its context, SGLang "
            "`--max-running-requests`); below the cap prefill is the limit (SGLang "
            "`--chunked-prefill-size`, llama.cpp `-b`/`-ub`).",
            4,
        ),
        VerdictInfo(
            "idle",
            "idle",
            "Nothing running, nothing waiting and no tokens generated in the rate window.",
            "Nothing to fix: send load (`llmb-loadgen run`) to see where it slows down.",
            1,
        ),
        VerdictInfo(
            "decode_at_card_limit",
            "decode_at_card_limit",
            f"Decode runs at {t('decode_efficiency_at_limit')} or more of the card's "
            "memory-bandwidth roofline: the card is the limit.",
            "Read fewer bytes per token (a smaller quantization, a quantized KV cache, shorter "
            "contexts), batch more requests per step, or use a card with more memory "
            "bandwidth; another engine gains little on decode.",
            2,
        ),
        VerdictInfo(
            "decode_below_card_limit",
            None,
            f"Decode runs below {t('decode_efficiency_at_limit')} of the card's roofline (or "
            "no roofline is known, or it does not fit the measurement: efficiency above "
            f"{t('decode_efficiency_physical_max')}, see `llmb:engine_roofline:misfit`) with no "
            "queue and no memory problem: the engine or its settings set the speed.",
            "Tune the engine: flash attention (llama.cpp `-fa on`), CUDA graphs, batch sizes "
            "(`-b`, `-ub`), a faster kernel for this quantization; or compare another engine "
            "on the same weights (`llmb-loadgen compare`).",
            3,
        ),
    )
}

# Worst first, for fleet views: an engine that is down ranks above every verdict.
SEVERITY: dict[str, int] = {"engine_down": 7} | {v: VERDICT_INFO[v].severity for v in VERDICTS}


@dataclass(frozen=True)
class Verdict:
    """The decision for one engine: the verdict, every condition's result, the evidence."""

    name: str
    conditions: tuple[ConditionResult, ...]
    evidence: tuple[str, ...]

    @property
    def info(self) -> VerdictInfo:
        """Summary, action and severity of this verdict."""
        return VERDICT_INFO[self.name]

    @property
    def action(self) -> str:
        """What to do: the first held evidence's own action, else the verdict's."""
        cond = self.info.condition
        if cond is not None:
            for alt in CONDITION_BY_NAME[cond].alternatives:
                if alt.action is not None and alt.label in self.evidence:
                    return alt.action
        return self.info.action

    @property
    def summary(self) -> str:
        """What the verdict means, in one sentence."""
        return self.info.summary

    def held(self, condition: str) -> bool:
        """Whether the named condition held."""
        return any(c.held for c in self.conditions if c.name == condition)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: verdict, evidence, every condition (held or not), summary, action."""
        return {
            "verdict": self.name,
            "evidence": list(self.evidence),
            "conditions": {c.name: c.held for c in self.conditions},
            "summary": self.summary,
            "action": self.action,
        }


def evaluate(signals: Signals) -> Verdict:
    """The verdict the rules give an engine that is up with these signals."""
    results = tuple(c.evaluate(signals) for c in CONDITIONS)
    by_name = {r.name: r for r in results}
    for name in VERDICTS:
        cond = VERDICT_INFO[name].condition
        if cond is None:
            return Verdict(name, results, ())
        if by_name[cond].held:
            return Verdict(name, results, by_name[cond].evidence)
    raise AssertionError("VERDICTS must end with a fallback verdict")  # pragma: no cover


# ------------------------------------------------------------------------------ roofline


@dataclass(frozen=True)
class ModelStructure:
    """What the roofline knows about the bytes a model reads per decode step.

    `weights_bytes` is every weight in the file. With `always_read_bytes` known, a step
    reads those, the expected share of the routed experts (`routed_expert_bytes`, E =
    `experts`, k = `experts_used`) that the batch touches, and one row of an untied token
    embedding per sequence; without it every weight counts as read (a dense model). A draft
    model (speculative decoding) adds `draft_weights_bytes` per proposed token.
    """

    weights_bytes: float | None = None
    always_read_bytes: float | None = None
    routed_expert_bytes: float | None = None
    experts: float | None = None
    experts_used: float | None = None
    token_embedding_row_bytes: float | None = None
    draft_weights_bytes: float | None = None

    @property
    def structure_known(self) -> bool:
        """Whether the always-read and routed-expert bytes are known (else: all weights)."""
        return self.always_read_bytes is not None and self.routed_expert_bytes is not None

    @property
    def experts_known(self) -> bool:
        """Whether the routed-expert share is known: no routed experts, or E and k."""
        if not self.structure_known:
            return False
        if not self.routed_expert_bytes:
            return True
        return self.experts_used is not None and self.experts is not None and self.experts > 0


def go_pow(x: float, y: float) -> float:
    """`x ^ y` as PromQL computes it (Go's math.Pow) for an integer `y`, bit for bit.

    Go multiplies normalized mantissas by repeated squaring and scales once at the end;
    C's pow (Python's `**`) rounds differently in the last bit, which the parity test sees.
    """
    if y == 0 or x == 1:
        return 1.0
    if y == 1:
        return x
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if y != int(y) or math.isinf(y) or math.isinf(x) or x == 0:
        return float(x**y)
    a1, ae = 1.0, 0
    x1, xe = math.frexp(x)
    i = int(abs(y))
    while i != 0:
        if xe < -(1 << 12) or (1 << 12) < xe:
            ae += xe
            break
        if i & 1 == 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1 = 1 / a1
        ae = -ae
    return math.ldexp(a1, ae)


def decode_batch(running_avg: float | None) -> float:
    """Sequences per decode step for the roofline: the average running, rounded, at least 1.

    PromQL `clamp_min(round(x), 1)` (round: floor(x + 0.5)); 1 when unknown. Whole
    sequences keep the expert share `1 - (1 - k/E)^B` exact in PromQL and Python alike.
    """
    if running_avg is None or math.isnan(running_avg):
        return 1.0
    return max(float(math.floor(running_avg + 0.5)), 1.0)


def expert_share(experts: float, experts_used: float, batch: float) -> float:
    """Expected share of the E routed experts that B sequences touch with k experts each.

    Under uniform routing one expert is missed by one token with probability 1 - k/E, so
    by all B with (1 - k/E)^B: an expectation, not a measurement (real routers are skewed,
    which lowers it).
    """
    return 1 - go_pow(1 - experts_used / experts, batch)


def active_weights_bytes(model: float | ModelStructure, batch: float = 1.0) -> float:
    """Weight bytes one decode step of `batch` sequences reads (the draft model excluded).

    always-read + routed x (1 - (1 - k/E)^B) + B x token-embedding row; all weights when
    the structure is unknown, all routed experts when E or k is. Same order of operations
    as the recording rule `engine:llmb_decode_weights_bytes_per_step:avg5m`.
    """
    if not isinstance(model, ModelStructure):
        return float(model)
    if not model.structure_known:
        if model.weights_bytes is None:
            raise ValueError("neither the weight bytes nor the model structure is known")
        return float(model.weights_bytes)
    assert model.always_read_bytes is not None and model.routed_expert_bytes is not None
    routed = float(model.routed_expert_bytes)
    if model.experts_known and model.routed_expert_bytes:
        assert model.experts is not None and model.experts_used is not None
        routed = routed * expert_share(model.experts, model.experts_used, batch)
    total = float(model.always_read_bytes) + routed
    if model.token_embedding_row_bytes is not None:
        total = total + model.token_embedding_row_bytes * batch
    return total


def accepted_tokens(accept_length: float | None) -> float:
    """Tokens per target-model step: the speculative accept length (at least 1), else 1.

    PromQL `clamp_min(x, 1)`, NaN included (Go's math.Max keeps a NaN).
    """
    if accept_length is None:
        return 1.0
    if math.isnan(accept_length):
        return math.nan
    return max(float(accept_length), 1.0)


def decode_bytes_per_step(
    model: float | ModelStructure,
    kv_tokens: float | None = None,
    kv_bytes_per_token: float | None = None,
    batch: float = 1.0,
    accept_length: float | None = None,
) -> float:
    """Bytes one decode step reads, the one formula every surface uses:

        active_weights_bytes(model, B) + kv_tokens x kv_bytes_per_token
                                       + draft_weights x accepted tokens per step

    `model` is a `ModelStructure` or (a dense model) its weight bytes. `kv_tokens` is the KV
    cache tokens in use (all running sequences together); without it or the KV bytes per
    token the KV term is 0, as in the rules. The draft model runs once per token it
    proposes: the accepted ones and the rejected one that ends the step, about the accept
    length.
    """
    weights = active_weights_bytes(model, batch)
    total = weights
    if kv_tokens is not None and kv_bytes_per_token is not None:
        total = total + kv_tokens * kv_bytes_per_token
    draft = model.draft_weights_bytes if isinstance(model, ModelStructure) else None
    if draft is not None:
        total = total + draft * accepted_tokens(accept_length)
    return total


def roofline_tokens_per_second(
    bandwidth_bytes_per_second: float | None,
    bytes_per_step: float | None,
    accept_length: float | None = None,
) -> float | None:
    """Upper bound on per-sequence decode tok/s: bandwidth x accepted tokens / bytes per step.

    Each step yields one token per running sequence (`accept_length` with speculative
    decoding), so per-sequence speed cannot exceed this. None without a bandwidth or bytes.
    """
    if bandwidth_bytes_per_second is None or bytes_per_step is None or not bytes_per_step > 0:
        return None
    return bandwidth_bytes_per_second * accepted_tokens(accept_length) / bytes_per_step


def decode_efficiency(
    decode_tokens_per_second: float | None, roofline: float | None
) -> float | None:
    """Measured per-sequence decode tok/s / roofline tok/s (None when either is unknown)."""
    if decode_tokens_per_second is None or roofline is None or not roofline > 0:
        return None
    return decode_tokens_per_second / roofline


def tp_bandwidth(
    gpus: Iterable[tuple[float, float]],
) -> float | None:
    """Bandwidth of the GPUs one engine holds, from (bandwidth, engine memory) per GPU.

    Each GPU reads its share of the bytes of a step (the share of the engine's GPU memory on
    it: weights and KV split alike) and the step lasts as long as the slowest: the engine's
    bandwidth is min(bandwidth_i / share_i), the sum of the bandwidths for an even split and
    exactly the one GPU's bandwidth on one GPU. None when no GPU holds memory.
    """
    items = list(gpus)
    held = 0.0
    for _, mem in items:
        held += mem
    best: float | None = None
    for bw, mem in items:
        share = mem / held if held else math.nan
        if not share > 0 or math.isnan(bw):
            continue
        value = bw / share
        if best is None or value < best:
            best = value
    return best


# ---------------------------------------------------------------------- physics gate


@dataclass(frozen=True)
class MisfitReason:
    """Why a decode efficiency above `decode_efficiency_physical_max` is possible: the fact
    the bytes-per-step model lacks (the first that applies wins)."""

    name: str
    lacks: str
    cause: str


MISFIT_REASONS: tuple[MisfitReason, ...] = (
    MisfitReason(
        "model_structure_unknown",
        "the model's structure (llmb_model_weights_always_read_bytes, "
        "llmb_model_weights_routed_experts_bytes): every weight counts as read per step",
        "a mixture-of-experts model whose expert metadata is unknown reads only its active "
        "experts; give the exporter/diagnose the model file (GGUF or HF config)",
    ),
    MisfitReason(
        "expert_counts_unknown",
        "the expert counts (llmb_model_experts, llmb_model_experts_used): every routed expert "
        "counts as read per step",
        "a mixture-of-experts model reads only k of its E experts per token; the model file "
        "lacks `expert_count` / `expert_used_count`",
    ),
    MisfitReason(
        "speculative_decoding_not_detected",
        "the speculative accept length (llmb_engine_spec_accept_length): one token per "
        "model step is assumed",
        "speculative decoding (llama.cpp `-md`, SGLang `--speculative-algorithm`) makes "
        "several tokens per weight read; its acceptance was not seen",
    ),
    MisfitReason(
        "bandwidth_too_low",
        "a right GPU memory bandwidth: the model, experts and acceptance are all known",
        "the bandwidth (NVML table, the config's `gpu.bandwidth_bytes_per_second` or "
        "--bandwidth-gbs) is lower than the card's; check the GPU model and the value given",
    ),
)
MISFIT_BY_NAME: dict[str, MisfitReason] = {r.name: r for r in MISFIT_REASONS}


@dataclass(frozen=True)
class RooflineFacts:
    """What the bytes-per-step model knew when it was computed."""

    structure_known: bool
    experts_known: bool
    accept_known: bool


def roofline_facts(model: float | ModelStructure, accept_length: float | None) -> RooflineFacts:
    """The facts of `model` (a bare weight count knows no structure) and the acceptance."""
    if isinstance(model, ModelStructure):
        return RooflineFacts(model.structure_known, model.experts_known, accept_length is not None)
    return RooflineFacts(False, False, accept_length is not None)


def physical(efficiency: float | None) -> bool:
    """Whether a decode efficiency is within physics (absent counts as no claim, fine)."""
    return efficiency is None or efficiency <= number("decode_efficiency_physical_max")


def roofline_misfit(efficiency: float | None, facts: RooflineFacts) -> MisfitReason | None:
    """The reason the roofline does not fit the measurement, None when it does."""
    if physical(efficiency):
        return None
    if not facts.structure_known:
        return MISFIT_BY_NAME["model_structure_unknown"]
    if not facts.experts_known:
        return MISFIT_BY_NAME["expert_counts_unknown"]
    if not facts.accept_known:
        return MISFIT_BY_NAME["speculative_decoding_not_detected"]
    return MISFIT_BY_NAME["bandwidth_too_low"]


def misfit_text(efficiency: float, reason: MisfitReason) -> str:
    """One sentence for every surface: no decode verdict, the likely cause, what is lacking."""
    return (
        f"no decode verdict: the bytes-per-step model does not fit the measurement "
        f"(decode at {efficiency * 100:.0f} % of the roofline, above "
        f"{number('decode_efficiency_physical_max') * 100:.0f} %: beyond physics). Likely "
        f"cause: {reason.cause}. Lacking: {reason.lacks}"
    )


# -------------------------------------------------------------------- expert offload


def experts_host_bound(
    host_bytes: float | None,
    experts: float | None,
    experts_used: float | None,
    batch: float = 1.0,
    host_bandwidth: float | None = None,
) -> float | None:
    """Per-sequence decode tok/s that experts in host memory allow: host memory bandwidth /
    (host expert bytes x the share of experts a step touches; all of them without E/k).

    Same arithmetic as `engine:llmb_experts_host_bound_tokens_per_second:avg5m`.
    """
    if host_bytes is None:
        return None
    share = 1.0
    if experts_used is not None and experts is not None and experts > 0:
        share = expert_share(experts, experts_used, batch)
    read = host_bytes * share
    if not read > 0:
        return None
    bw = (
        number("host_memory_bandwidth_bytes_per_second")
        if host_bandwidth is None
        else host_bandwidth
    )
    return bw / read


def expert_offload_action(
    host_layers: float | None,
    host_bytes: float | None,
    expert_share_: float = 1.0,
    host_bandwidth: float | None = None,
) -> str:
    """The residency action for experts kept in host memory, with the host-side bound.

    Decode reads `host_bytes x expert_share_` from host memory per step; at
    `host_bandwidth` (default: the `host_memory_bandwidth_bytes_per_second` threshold)
    that bounds decode at bandwidth / those bytes tok/s per sequence.
    """
    bw = host_bandwidth or number("host_memory_bandwidth_bytes_per_second")
    layers = f"{host_layers:.0f} layers" if host_layers is not None else "some layers"
    text = f"Expert offload: the routed experts of {layers} live in host memory"
    if host_bytes:
        per_step = host_bytes * expert_share_
        text += (
            f" ({host_bytes / 2**30:.2f} GiB; {per_step / 2**30:.2f} GiB read per step), so "
            f"decode is bound near {bw / per_step:.1f} tok/s per sequence by host memory "
            f"({bw / 1e9:.0f} GB/s, `host_memory_bandwidth_bytes_per_second`: the CPU "
            "computes host-resident experts at batch sizes below 32)"
        )
    return (
        text + ". Keep fewer experts on the host (a lower llama.cpp `--n-cpu-moe`, or no "
        "`-ot exps=CPU`) if VRAM allows, or use a smaller quantization so they fit on the GPU."
    )


# ------------------------------------------------------------- signals from raw samples

Labels = tuple[tuple[str, str], ...]
# (metric name, sorted label pairs): the same key tests/plugins/exporter.py parses to.
SeriesKey = tuple[str, Labels]
# A series: (unix seconds, value) pairs in time order.
Points = Sequence[tuple[float, float]]

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


def _max_by(items: Iterable[tuple[EngineKey, float]]) -> dict[EngineKey, float]:
    """PromQL `max by (...)`: NaN only when every value is NaN."""
    out: dict[EngineKey, float] = {}
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
    per_device: dict[tuple[EngineKey, str], float] = {}
    for lab, v in d.instant(name, match):
        dk = (_key(lab), lab.get("device", ""))
        old = per_device.get(dk)
        if old is None or math.isnan(old) or (not math.isnan(v) and v > old):
            per_device[dk] = v
    out: dict[EngineKey, float] = {}
    for (key, _), v in per_device.items():
        out[key] = out.get(key, 0.0) + v
    return out


def admission_values(d: _Data) -> dict[str, dict[EngineKey, float]]:
    """The admission and SGLang-residency signals per engine (Signals field -> values).

    The same arithmetic, in the same order, as their recording rules (prometheus/generate.py
    `admission_rules`): running against its cap, the KV the running requests plus one more
    would need against the pool, and SGLang's process GPU memory beyond its KV pool. Peaks
    over `queue_window`, not averages: the pool binds at its fullest moment, and averages
    count the gaps between one request's end and the next one's admission.
    """
    qw, rw = seconds("queue_window"), seconds("rate_window")
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


def rule_values_at(series: Mapping[SeriesKey, Points], at: float) -> dict[EngineKey, RuleValues]:
    """The recording rules' per-engine values at `at` (unix seconds) for every engine up."""
    d = _Data(series, at)
    rw, qw = seconds("rate_window"), seconds("queue_window")

    def mx(
        name: str, match: Callable[[dict[str, str]], bool] | None = None
    ) -> dict[EngineKey, float]:
        return _max_by((_key(lab), v) for lab, v in d.instant(name, match))

    def rate(name: str) -> dict[EngineKey, float]:
        vals = []
        for lab, pts in d.range(name, rw):
            r = _extrapolated(pts, d.at, rw, rate=True)
            if r is not None:
                vals.append((_key(lab), r))
        return _max_by(vals)

    def avg(name: str) -> dict[EngineKey, float]:
        return _max_by((_key(lab), _avg_over_time(pts)) for lab, pts in d.range(name, qw))

    up = {k for k, v in mx("llmb_engine_up").items() if v == 1}
    running = mx("llmb_engine_requests_running")
    waiting = mx("llmb_engine_requests_waiting")
    waiting_avg = avg("llmb_engine_requests_waiting")
    kv_avg = avg("llmb_engine_kv_cache_usage_ratio")

    # sum by (engine) (max by (engine, event) (increase(...)))
    per_event: dict[tuple[EngineKey, str], float] = {}
    for lab, pts in d.range("llmb_engine_kv_pressure_events_total", rw):
        inc = _extrapolated(pts, d.at, rw, rate=False)
        if inc is None:
            continue
        ek = (_key(lab), lab.get("event", ""))
        old = per_event.get(ek)
        if old is None or math.isnan(old) or (not math.isnan(inc) and inc > old):
            per_event[ek] = inc
    pressure: dict[EngineKey, float] = {}
    for (key, _), inc in per_event.items():
        pressure[key] = pressure.get(key, 0.0) + inc

    decode_rate = _divide(
        rate("llmb_engine_decode_tokens_total"), rate("llmb_engine_decode_seconds_total")
    )
    gen_rate = rate("llmb_engine_generation_tokens_total")
    weights = mx("llmb_model_weights_bytes")
    memory_ratio = _divide(mx("llmb_engine_process_gpu_memory_bytes"), weights)
    per_device: dict[tuple[EngineKey, str], float] = {}
    for lab, v in d.instant(
        "llmb_engine_model_buffer_bytes",
        lambda lab: re.fullmatch(r"(?i)cpu.*", lab.get("device", "")) is None,
    ):
        dk = (_key(lab), lab.get("device", ""))
        old = per_device.get(dk)
        if old is None or math.isnan(old) or (not math.isnan(v) and v > old):
            per_device[dk] = v
    buffers: dict[EngineKey, float] = {}
    for (key, _), v in per_device.items():
        buffers[key] = buffers.get(key, 0.0) + v
    buffers_ratio = _divide(buffers, weights)
    layers_ratio = _divide(
        mx("llmb_engine_gpu_layers_offloaded"), mx("llmb_engine_gpu_layers_total")
    )
    gpu_hosts = {lab.get("host", "") for lab, _ in d.instant("llmb_gpu_memory_total_bytes")}

    # Bandwidth: each GPU the engine's processes hold reads its share of a step (the share
    # of the engine's GPU memory on it); the slowest GPU sets the pace (`tp_bandwidth`).
    gpu_bw: dict[tuple[str, str], float] = {}
    for lab, v in d.instant("llmb_gpu_memory_bandwidth_bytes_per_second"):
        gk = (lab.get("host", ""), lab.get("gpu", ""))
        old = gpu_bw.get(gk)
        if old is None or math.isnan(old) or (not math.isnan(v) and v > old):
            gpu_bw[gk] = v
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for lab, _ in d.instant("llmb_engine_up"):
        kinds[(lab.get("host", ""), lab.get("engine", ""))].add(lab.get("kind", ""))
    per_pid: dict[tuple[str, str, str, str], float] = {}
    for lab, v in d.instant(
        "llmb_gpu_process_memory_used_bytes", lambda lab: lab.get("engine", "") != ""
    ):
        pk = (lab.get("host", ""), lab.get("engine", ""), lab.get("gpu", ""), lab.get("pid", ""))
        old = per_pid.get(pk)
        if old is None or math.isnan(old) or (not math.isnan(v) and v > old):
            per_pid[pk] = v
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

    kv_tokens = _max_by(
        (_key(lab), _avg_over_time(pts))
        for lab, pts in d.range("llmb_engine_kv_cache_used_tokens", rw)
    )
    kv_bpt = mx("llmb_model_kv_bytes_per_token_estimated")
    admission = admission_values(d)
    running_avg = _max_by(
        (_key(lab), _avg_over_time(pts)) for lab, pts in d.range("llmb_engine_requests_running", rw)
    )
    always = mx("llmb_model_weights_always_read_bytes")
    routed = mx("llmb_model_weights_routed_experts_bytes")
    n_experts = mx("llmb_model_experts")
    n_used = mx("llmb_model_experts_used")
    embd_row = mx("llmb_model_token_embedding_row_bytes")
    draft = mx("llmb_model_draft_weights_bytes")
    accept = mx("llmb_engine_spec_accept_length")
    host_layers = mx("llmb_engine_experts_host_layers")
    host_bytes = mx("llmb_engine_experts_host_bytes")

    out: dict[EngineKey, RuleValues] = {}
    for key in sorted(up):
        batch = decode_batch(running_avg.get(key))
        model = ModelStructure(
            weights_bytes=weights.get(key),
            always_read_bytes=always.get(key),
            routed_expert_bytes=routed.get(key),
            experts=n_experts.get(key),
            experts_used=n_used.get(key),
            token_embedding_row_bytes=embd_row.get(key),
            draft_weights_bytes=draft.get(key),
        )
        active = bytes_step = None
        if model.structure_known or model.weights_bytes is not None:
            active = active_weights_bytes(model, batch)
            bytes_step = decode_bytes_per_step(
                model, kv_tokens.get(key), kv_bpt.get(key), batch, accept.get(key)
            )
        roofline = roofline_tokens_per_second(bandwidth.get(key), bytes_step, accept.get(key))
        efficiency = decode_efficiency(decode_rate.get(key), roofline)
        reason = roofline_misfit(efficiency, roofline_facts(model, accept.get(key)))
        signals = Signals(
            layers_ratio=layers_ratio.get(key),
            weights_buffers_ratio=buffers_ratio.get(key),
            weights_memory_ratio=memory_ratio.get(key),
            host_has_gpu=key.host in gpu_hosts,
            kv_usage_avg=kv_avg.get(key),
            waiting_avg=waiting_avg.get(key),
            kv_pressure_increase=pressure.get(key),
            running=running.get(key),
            waiting=waiting.get(key),
            **{name: values.get(key) for name, values in admission.items()},
            generation_tokens_per_second=gen_rate.get(key),
            decode_efficiency=efficiency,
            experts_host_layers=host_layers.get(key),
        )
        out[key] = RuleValues(
            signals,
            decode_rate.get(key),
            bandwidth.get(key),
            bytes_step,
            roofline,
            decode_batch=batch,
            active_weights_bytes=active,
            accepted_tokens_per_step=accepted_tokens(accept.get(key)),
            misfit=reason.name if reason is not None else None,
            experts_host_bound_tokens_per_second=experts_host_bound(
                host_bytes.get(key), n_experts.get(key), n_used.get(key), batch
            ),
        )
    return out


def signals_at(series: Mapping[SeriesKey, Points], at: float) -> dict[EngineKey, Signals]:
    """`Signals` of every engine up at `at`, computed as the recording rules do."""
    return {k: v.signals for k, v in rule_values_at(series, at).items()}


def verdicts_at(series: Mapping[SeriesKey, Points], at: float) -> dict[EngineKey, Verdict]:
    """The verdict of every engine up at `at`: `evaluate(signals_at(...))`."""
    return {k: evaluate(v) for k, v in signals_at(series, at).items()}
