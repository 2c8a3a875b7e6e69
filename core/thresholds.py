"""Thresholds: each value the conditions compare against, as PromQL text, with its unit and why."""

from __future__ import annotations

import re
from dataclasses import dataclass

from core import series as llmb

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
        "datasheet peak bandwidth (scaled by the memory clock NVML measured against its "
        "maximum), which tuned memory-bound kernels reach to 60-90 % and measured stream "
        "copies to about 84-95 % (H200: 4.8 TB/s datasheet, issue 27); at "
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
    # --- the card's own state (issue 27) ------------------------------------------------
    "card_slowdown_share_min": Threshold(
        "0.5",
        "ratio",
        "Share of the busy samples of `rate_window` (those without `gpu_idle`) in which NVML "
        "reported a power (SW power cap, HW slowdown, HW power brake) or a thermal (SW/HW "
        "thermal slowdown) clock event reason, at or above which the card counts as slowed: "
        "the GPU then worked on a slowed card at least half of the time it worked. Idle gaps "
        "between requests do not dilute it; a brief power-cap touch during a long prefill is "
        "normal and stays below it. The H200 of "
        "issue 27 reported no reason under load (about 500 W of 700 W, 55 C).",
    ),
    "sm_clock_ratio_min": Threshold(
        "0.8",
        "ratio",
        "Mean SM clock over the busy samples of `rate_window` / the maximum SM clock below "
        "which the clocks are held well below maximum even without a reason NVML names "
        "(locked or application clocks): the H200 of issue 27 held 1980 of 1980 MHz under "
        "decode; at its stock 700 W limit under F16 prefill it averaged 0.96 (1605-1980 MHz); "
        "a card capped well below its stock limit sits at 60-75 % of its boost clock.",
    ),
    "card_busy_utilization_min": Threshold(
        "0.5",
        "ratio",
        "NVML GPU utilization at or above which a sample counts as busy for the SM clock "
        f"under load (`{llmb.GPU_SM_CLOCK_BUSY_HERTZ}`): a kernel ran at least half of NVML's "
        "sample period. The samples around requests (0-20 %) keep the boost clock with no "
        "work to slow, and would read as an unslowed card (issue 32: the window's highest "
        "clock read 1.0 where the busy samples ran at 92-96 %).",
    ),
    "card_shortfall_explained_min": Threshold(
        "0.2",
        "ratio",
        "Share of the gap to the roofline that the lost clock explains, (1 - the lower of "
        "the SM clock ratio under load and the memory clock ratio) / (1 - the lowest of "
        "decode and prefill efficiency against the maximum clocks' roofline; 1 without a "
        "roofline), at or above which the card's state is the cause (`card_throttled`): below it, "
        "restoring every lost MHz would recover less than a fifth of what is missing and the "
        "engine is the larger lever. A fifth matches `sm_clock_ratio_min`: clocks held below "
        "0.8 always explain it. Issue 32's F16 prefill on an H200 at its stock 700 W: 4 % of "
        "the clock lost against a gap of 86-96 % (4-5 %), evidence only; a limit lowered to "
        "60 % or a thermal slowdown to 55-76 % of the clock explains 24-60 %.",
    ),
    "power_limit_lowered_ratio": Threshold(
        "0.99",
        "ratio",
        "Enforced power limit / the card's default limit below which someone lowered it "
        "(`nvidia-smi -pl`, the host's or BMC's cap); the 1 % covers limits read back in "
        "whole watts.",
    ),
    # --- prefill and the time before the first token (issue 27) ---------------------------
    "prefill_prompt_tokens_min": Threshold(
        "1024",
        "tokens",
        "Mean prompt tokens per request at or above which prompts count as long: prefill "
        "then costs at least as much as a hundred or so decode steps, and the time before the "
        "first token is worth splitting into waiting and work.",
    ),
    "prefill_efficiency_at_limit": Threshold(
        "0.5",
        "ratio",
        "Measured prompt tok/s x FLOPs per prompt token / the card's dense BF16 peak (at the "
        "SM clock it ran under load, issue 32) at or above which prefill is at the card's "
        "compute limit. Tuned GEMMs reach 60-80 % of the "
        "datasheet peak; llama.cpp Q4_0 on an H200 measured about 0.15 (3000 tok/s at 8k "
        "tokens of a 27B model). Above `decode_efficiency_physical_max` no claim is made.",
    ),
    "ttft_wait_share_low": Threshold(
        "0.25",
        "ratio",
        "Waiting / (waiting + prefill) before the first token below which requests barely "
        "wait: the prompt's own computation is the time before the first token.",
    ),
    "ttft_wait_share_high": Threshold(
        "0.5",
        "ratio",
        "Waiting / (waiting + prefill) at or above which the time before the first token is "
        "mostly waiting for admission, not computing the prompt.",
    ),
    "prefill_time_share_high": Threshold(
        "0.5",
        "ratio",
        "Prompt seconds / (prompt + decode seconds) at or above which the engine spends most "
        "of a request computing its prompt: prefill, not decode, sets the speed.",
    ),
    "experts_host_bound_near_ratio": Threshold(
        "0.8",
        "ratio",
        "Measured per-sequence decode / the expert-offload bound (host memory bandwidth / "
        "host expert bytes a step reads) from which, up to 2 - this, host memory is the "
        "limit (within 20 % of the bound): the action then says what moving more layers' "
        "experts to the GPU buys. Further above, the bandwidth figure is too low for the "
        "engine's access pattern. The bandwidth is measured on the host "
        f"({llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND}) or given.",
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
    "for_card_throttled": Threshold(
        "5m",
        "duration",
        "`for:` of LLMCardThrottled (its signals are already shares of the 5m rate window).",
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


def threshold_promql(name: str) -> str:
    """The value of one threshold as it appears in PromQL."""
    return THRESHOLDS[name].value


def threshold_number(name: str) -> float:
    """A ratio, request-count or byte threshold as a float (as PromQL parses it)."""
    th = THRESHOLDS[name]
    if th.unit in ("range", "duration"):
        raise ValueError(f"threshold {name!r} is a {th.unit}; use threshold_seconds()")
    return float(th.value)


def threshold_seconds(name: str) -> float:
    """A range or duration threshold (`5m`, `1h30m`) in seconds."""
    text = threshold_promql(name)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"threshold {name!r} = {text!r} is not a duration")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


# --------------------------------------------------------------------------- compare

# `compare` calls a winner only when the bootstrap interval of the ratio B/A lies wholly
# above 1 + this, or wholly below 1 / (1 + this). On a shared host, back-to-back runs of
# one engine differ by a few percent in ways no resampling of one run's requests can see
# (clocks, other tenants, the allocator), so a difference smaller than this is noise,
# however many requests measured it. Also the floor `compare` used between rounds before.
COMPARE_NOISE_FLOOR = 0.05
# From this many rounds on, the bootstrap resamples whole rounds and its interval carries
# the round-to-round noise; `compare`'s default `--rounds`.
FULL_ROUNDS = 3
# The smallest difference (B/A - 1, or its inverse) called with 1 or 2 rounds. One round shows
# no round-to-round spread and two a poor estimate of it, while a whole round of one engine
# moves by several percent (warm-up, clocks, other tenants; 2-7 % between the two rounds of
# most steps of the H200 same-weights run). With 5 % round noise per engine, the ratio of two
# single rounds moves by sqrt(2) x 5 % = 7 %, so 1.96 x 7 % = 14 % -> 15 %; two rounds are
# resampled (about half of that noise is seen) -> 10 %. Checked by simulation: identical
# engines called different in at most 1 run of 40 (`bench/switch_noise.py`, docs/diagnose.md
# "How much noise can flip the call").
RESOLVABLE_DIFFERENCE = {1: 0.15, 2: 0.10}
# A step above c=1 is latency-bound, and compared on the whole request (TTFT + decode, end
# to end) as c=1 is, when the engine in use's median TTFT is at least this share of its
# mean end-to-end time per request: most of what a user waits for is then the wait for the
# first token (a queue in front of too few slots, or prefill), which decode speed and a
# step's tokens/s both hide. At c=1 with a short prompt TTFT is a few % of e2e; a 1-slot
# server at c=16 queues 15 requests and its TTFT is most of e2e. Half: the wait outweighs
# the decode.
LATENCY_BOUND_TTFT_SHARE = 0.5
# A deciding figure whose rounds spread more than this ((max - min) / median of one engine's
# rounds) gets a caveat beside the call: between rounds of a steady engine on a quiet host the
# figures moved 2-7 % (the H200 runs) and the noise model of `bench/switch_noise.py` goes to
# 10 %; half the median is no engine's own noise but another load on the card or the CPU,
# which the call cannot tell from the engines (a 237 % spread on a shared 2-core host
# called a 19.9x switch between two builds of one model, with no caveat).
ROUND_SPREAD_UNSTEADY = 0.5
