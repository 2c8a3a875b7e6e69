"""The typed results of `diagnose` and `compare`: what was measured, and the answer.

The same objects feed the terminal output, `results.json`, `report.md` and `report.html`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any

from core.roofline import HostOffload, ModelStructure, expert_share
from core.slo import StepSlo, gaps
from core.stats import relative_spread
from loadgen.traffic.summary import TrafficMix

# The recommendation vocabulary of results.json, and `switch_to(engine)` below.
STAY_AND_TUNE = "stay_and_tune"
# compare: nothing differs beyond the noise, so the engine in use stays (no tuning implied).
STAY = "stay"
FIX_MEMORY_FIRST = "fix_memory_first"
INCONCLUSIVE = "inconclusive"

NOT_MEASURED = "not measured: "


def verdict_text(verdict: str | None) -> str:
    """A verdict as every surface says it: its name, or `not measured` where no load step
    measured the engine (never `idle`, which says it was measured and had nothing to fix)."""
    return "not measured" if verdict is None else verdict


def switch_to(engine: str) -> str:
    """The recommendation to switch to `engine`: `switch_to:<engine>`."""
    return f"switch_to:{engine}"


def utc_now() -> str:
    """Now in UTC, ISO 8601 with a `Z`."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class PhaseMark:
    """One timestamped phase of a run (baseline, start, settle, single, ...)."""

    name: str
    start: float
    end: float | None = None
    memory_bytes: float | None = None
    peak_memory_bytes: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Row:
    """One measured step: a fixed context, slot count, prompt and concurrency, all else equal.

    With several rounds the headline figures are medians and `*_rounds` keep every round.
    Frozen: `diagnose.load` adds the rounds up apart and makes the row once they have run;
    what is learnt later (the step's evidence, the context sweep's load) is a new row.
    """

    engine: str
    step: str  # first | single | concurrency | prompt | context | kv_pressure
    concurrency: int
    context: int | None = None
    parallel: int | None = None
    prompt_tokens: float | None = None
    max_tokens: int = 0
    requests: int = 0
    requests_failed: int = 0
    completion_tokens: int = 0
    tokens_ok: bool = False
    ttft_s: float | None = None
    ttft_p99_s: float | None = None
    per_seq_tok_s: float | None = None
    per_token_ms: float | None = None
    server_per_token_ms: float | None = None
    aggregate_tok_s: float | None = None
    aggregate_rounds: list[float] = field(default_factory=list)
    ttft_rounds: list[float] = field(default_factory=list)
    per_seq_rounds: list[float] = field(default_factory=list)
    wall_s: float | None = None
    memory_bytes: float | None = None
    loaded_memory_bytes: float | None = None
    kv_bytes: float | None = None
    load_seconds: float | None = None
    # Error kinds of the failed requests (kv_exhausted, early_stop, http_error, ...).
    errors: dict[str, int] = field(default_factory=dict)
    # KV pressure seen during the step: truncated slots, "context size exceeded" and
    # "no free KV space" log lines, KV usage and queued requests (exporter or log).
    truncated: int = 0
    kv_exhausted: int = 0
    kv_events: int = 0
    kv_usage_max: float | None = None
    waiting_avg: float | None = None
    error: str | None = None
    # The card's limit at this step's batch (`row_roofline`): bytes one decode step reads,
    # the per-sequence limit, measured per-sequence tok/s / limit, the physics reason.
    bytes_per_step: float | None = None
    limit_tok_s: float | None = None
    efficiency: float | None = None
    misfit: str | None = None
    # The `step` numbers of this row's rounds in requests.jsonl (per engine), so a saved run
    # can be re-decided from its requests (`llmb-loadgen decide`). Empty in runs before it.
    record_steps: list[int] = field(default_factory=list)
    # The time before the first token, split (diagnose/decision/prefill.py): mean seconds a
    # request waited and computed its prompt, prompt tok/s over the time prompts were being
    # computed (the engine's own prompt timings), and that against the card's compute limit.
    queue_wait_s: float | None = None
    prefill_s: float | None = None
    prefill_tok_s: float | None = None
    prefill_efficiency: float | None = None
    # The SM clock under load over the step / its maximum (the rules' `sm_clock_ratio`): the
    # prefill limit is taken at that clock where it is below 1, as the rules take it. None:
    # no GPU series (the limit at the maximum clock).
    sm_clock_ratio: float | None = None
    # Where the split came from: "requests" (each request's TTFT less the engine's own prompt
    # time for it, llama.cpp `timings.prompt_ms`), "histograms" (the means of the engine's
    # queue-time and TTFT histograms over the step, SGLang); None: no split.
    ttft_split_source: str | None = None
    # The rules' prefill tok/s over the step's window (`engine:llmb_prefill_tokens_per_second`,
    # what Prometheus shows), from the exporter's series: the same figure as `prefill_tok_s`
    # from the engine's log and counters rather than the requests' timings. None: no series.
    rules_prefill_tok_s: float | None = None
    # Where `per_seq_tok_s` and `ttft_s` came from (diagnose/decision/sources.py): "client"
    # (the streamed chunks) or "engine" (its own timing: the streamed text was empty); None:
    # not measured, or a run saved before these fields.
    per_seq_source: str | None = None
    ttft_source: str | None = None
    # --traffic: cached / all prompt tokens over the step, from the engine's own counters
    # (llmb_engine_prompt_tokens_cached_total over llmb_engine_prompt_tokens_total); None:
    # no counters. `tokens_off`: requests whose usage differs from the traffic's lengths.
    prompt_cache_hit_ratio: float | None = None
    tokens_off: int = 0
    # --traffic on a schedule: requests sent more than 5 ms after the trace's time (held at
    # the cap on requests in flight, or a busy client), over all rounds, and the worst
    # round's p99 of the send error. Their TTFT counts from the send, so the answer says so.
    # None: no schedule.
    late_sends: int | None = None
    send_error_p99_s: float | None = None

    @property
    def spread(self) -> float | None:
        """Relative spread of the aggregate tok/s over rounds ((max - min) / median)."""
        return relative_spread(self.aggregate_rounds)


@dataclass(frozen=True)
class Roofline:
    """The card's decode limit for one engine and how much of it single-request decode uses.

    `bytes_per_step` = `active_weights_bytes` (weights one step reads: the always-read part,
    the routed experts a step touches, untied embedding rows) + KV in use x
    `kv_bytes_per_token` (+ a draft model's weights per proposed token); `limit_tok_s` =
    bandwidth x `accepted_tokens_per_step` / bytes per step. `misfit` is the physics gate:
    the reason (`core.roofline.MISFIT_REASONS`) when `efficiency` is beyond physics.
    """

    bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str | None = None
    bytes_per_step: float | None = None
    limit_tok_s: float | None = None
    measured_tok_s: float | None = None
    efficiency: float | None = None
    active_weights_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    accepted_tokens_per_step: float | None = None
    misfit: str | None = None

    @property
    def physical(self) -> bool:
        """Whether the efficiency may be shown as a share of the card's limit."""
        return self.misfit is None


@dataclass(frozen=True)
class Prefill:
    """The card's prefill limit for one engine and how much of it a step's prompts used.

    `flops_per_token` at `prompt_tokens` (the model's matmul and attention FLOPs, below);
    `limit_tok_s` = `peak_flops` (x `sm_clock_ratio`, the SM clock under load) / it;
    `measured_tok_s` from the engine's own prompt timings;
    `misfit`: the efficiency is beyond physics (no claim).
    """

    flops_per_token: float | None = None
    limit_tok_s: float | None = None
    measured_tok_s: float | None = None
    efficiency: float | None = None
    prompt_tokens: float | None = None
    peak_flops: float | None = None
    peak_source: str | None = None
    misfit: bool = False
    # The SM clock under load / its maximum the limit is taken at (`peak_flops` x it where
    # below 1; None: at the maximum clock).
    sm_clock_ratio: float | None = None
    matmul_flops: float | None = None
    attention_flops_full: float | None = None
    attention_flops_swa: float | None = None
    sliding_window: float | None = None


@dataclass(frozen=True)
class Facts(ModelStructure):
    """What is known of one engine apart from its load: the model, its precision and sizes,
    the card, the contexts and slots, the launch; `prefill` holds the limit's inputs (the
    card's compute peak, the model's FLOPs per token). A diagnose run gathers it as a value
    (`diagnose.facts`) and builds its `EngineResult` from it at the end. Frozen, as the
    result is: a fact learnt later is a new value (`dataclasses.replace`), never a write
    into one that a step or a report already holds."""

    name: str
    kind: str
    url: str | None = None
    model: str | None = None
    quantization: str | None = None
    parameters: float | None = None
    process_gpu_bytes: float | None = None
    gpu_buffer_bytes: float | None = None
    layers_offloaded: float | None = None
    layers_total: float | None = None
    gpu_total_bytes: float | None = None
    gpu_name: str | None = None
    gpu_driver: str | None = None
    engine_version: str | None = None
    bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str | None = None
    kv_bytes_per_token: float | None = None
    # Speculative decoding: mean tokens per target-model step (None: not seen).
    spec_accept_length: float | None = None
    # Expert offload: layers whose routed experts live in host memory, and their bytes.
    experts_host_layers: float | None = None
    experts_host_bytes: float | None = None
    # Host memory bandwidth for the expert-offload bound, and its source ("measured": the
    # exporter's copy at start; "flag": --host-bandwidth-gbs; "config"), and free VRAM.
    host_bandwidth_bytes_per_s: float | None = None
    host_bandwidth_source: str | None = None
    gpu_free_bytes: float | None = None
    trained_context: int | None = None
    slot_context: int | None = None
    memory_source: str | None = None
    load_seconds: float | None = None
    launched: bool = False
    slots: int | None = None
    prefill: Prefill = field(default_factory=Prefill)

    def structure(self) -> ModelStructure | None:
        """What the roofline knows about this model (None without weights or structure)."""
        if not self.weights_bytes and not self.structure_known:
            return None
        return self

    def bytes_per_parameter(self) -> float | None:
        """Weight bytes per parameter (the precision actually served)."""
        if self.weights_bytes and self.parameters:
            return self.weights_bytes / self.parameters
        return None


@dataclass(frozen=True)
class EngineResult(Facts):
    """Everything measured for one engine, and its verdict: its `Facts`, the rows of its
    load steps, what could not be measured, its roofline and prefill against the card,
    and the decision core's answer. `prefill` here is the facts' limit with the measured
    prompts of the engine's representative step (`diagnose.decision.prefill.row_prefill`)."""

    phases: list[PhaseMark] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    # Steps that did not run, as "step: why".
    missing: list[str] = field(default_factory=list)
    # (unix time, memory bytes) samples taken during the run, for the timeline plot.
    timeline: list[tuple[float, float]] = field(default_factory=list)
    roofline: Roofline = field(default_factory=Roofline)
    # The decision core's inputs as measured by this run, and its answer.
    signals: dict[str, float | bool | None] = field(default_factory=dict)
    # What the verdict had to take from diagnose's own measurements, and why.
    notes: list[str] = field(default_factory=list)
    verdict: str | None = None
    action: str = ""
    # Where the engine's log and model file came from ("--log-file PATH", "/props
    # model_path PATH", "the launch template"), or why they were not seen.
    evidence: dict[str, str] = field(default_factory=dict)
    # Why the procedure ended before its last step ("<step>: <reason>"); None: it ran through.
    stopped: str | None = None
    # The stop was Ctrl-C (or SIGTERM), not the engine.
    interrupted: bool = False
    # --traffic: the mix this engine was sent (None: the fixed prompts).
    traffic: TrafficMix | None = None

    def ok_rows(self, step: str | None = None) -> list[Row]:
        """Rows without an error, optionally of one step kind."""
        return [r for r in self.rows if r.error is None and (step is None or r.step == step)]

    def single(self) -> Row | None:
        """The single-sequence decode row (concurrency 1)."""
        return single_row(self.rows)

    def at_concurrency(self, concurrency: int) -> Row | None:
        """The load row at `concurrency` (the single row for 1). Of several (--find-max
        measures a level again with the requests an SLO needs to be judged), the one with the
        most requests, the later of equals."""
        for step in ("concurrency", "single"):
            rows = [
                r for r in self.ok_rows(step) if r.concurrency == concurrency and r.aggregate_tok_s
            ]
            if rows:
                return max(reversed(rows), key=lambda r: r.requests)
        return None

    def host_offload(self) -> HostOffload:
        """The expert-offload facts: host experts, the share one sequence's step reads, the
        host's bandwidth and its source, the measured per-sequence decode, free VRAM."""
        model = self.structure()
        share = 1.0
        if model is not None and model.experts_known and model.experts and model.experts_used:
            share = expert_share(model.experts, model.experts_used, 1.0)
        single = self.single()
        return HostOffload(
            self.experts_host_layers,
            self.experts_host_bytes,
            share,
            self.host_bandwidth_bytes_per_s,
            self.host_bandwidth_source,
            self.roofline.measured_tok_s or (single.per_seq_tok_s if single else None),
            self.gpu_free_bytes,
        )


def single_row(rows: list[Row]) -> Row | None:
    """The single-sequence decode row of `rows` (concurrency 1; the single step's first)."""
    ok = [r for r in rows if r.error is None and r.concurrency == 1 and r.per_seq_tok_s]
    preferred = [r for r in ok if r.step == "single"]
    pick = preferred or ok
    return pick[0] if pick else None


@dataclass
class Step:
    """One question of the procedure, its answer (or `not measured: why`) and its numbers."""

    key: str
    question: str
    answer: str
    decisive: bool = False
    # Plain values, or dataclasses (per-engine groups) that results.json shows as objects.
    numbers: dict[str, object] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return not self.answer.startswith(NOT_MEASURED)


@dataclass
class Estimate:
    """A labelled estimate: what an engine would do at the other engine's precision."""

    engine: str
    at_precision_of: str
    tok_s: float
    basis: str


@dataclass
class LoadAnswer:
    """Who is ahead at one concurrency, by how much (with its interval), on which figure."""

    concurrency: int
    what: str
    winner: str | None
    lead: str
    a: float
    b: float
    # What the call was taken over (the bootstrap's requests, or the rounds).
    basis: str = ""
    ratio_lo: float | None = None
    ratio_hi: float | None = None
    decidable: bool = True
    # Shown beside the figure: at c=1 the whole request's parts (decode and TTFT).
    beside: str = ""


@dataclass
class SloAnswer:
    """Each engine's steps against the user's SLO (each judged with confidence) and the
    highest measured load that meets it."""

    slo: str
    steps: dict[str, list[StepSlo]] = field(default_factory=dict)
    max_within: dict[str, int | None] = field(default_factory=dict)

    def judged(self, engine: str, load: int) -> bool | None:
        """Whether `engine` meets the SLO at `load` with confidence (True), misses it (False)
        or neither can be said (None). A measured level says it itself; between two levels,
        both when they agree; above the highest, a miss there; below the lowest, a meet."""
        steps = sorted(self.steps.get(engine, []), key=lambda s: s.concurrency)
        by_c = {s.concurrency: s.met for s in steps}
        if load in by_c:
            return by_c[load]
        below = [s.met for s in steps if s.concurrency < load]
        above = [s.met for s in steps if s.concurrency > load]
        if below and above:
            return below[-1] if below[-1] == above[0] else None
        if below:
            return False if below[-1] is False else None
        if above:
            return True if above[0] is True else None
        return None

    def meets(self, engine: str, load: int) -> bool:
        """Whether `engine` meets the SLO at `load` with confidence."""
        return self.judged(engine, load) is True

    def text(self) -> str:
        return f"at {self.slo}: " + "; ".join(self.engine_text(e) for e in self.steps)

    def engine_text(self, engine: str) -> str:
        """`sglang meets it up to c=64 (c=1: ttft_p99 0.04 s; c=16: not judged (...); ...)`,
        every level with what it says; a miss or no judgement below the highest level within
        is named as such (the answer is not monotonic there)."""
        steps = sorted(self.steps[engine], key=lambda s: s.concurrency)
        m = self.max_within[engine]
        head = (
            f"{engine} meets it up to c={m}"
            if m is not None
            else f"{engine} meets it at no measured load"
        )
        holes = [s.concurrency for s in gaps(steps)]
        if holes:
            head += ", but not at " + ", ".join(f"c={c}" for c in holes) + " below it"
        bits = [f"c={s.concurrency}: {_step_text(s)}" for s in steps]
        return head + (f" ({'; '.join(bits)})" if bits else "")


def seconds_text(value: float) -> str:
    """A latency to three figures: `23.9 ms` below a second, `1.46 s` above (an SLO of 20 ms
    beside `0.02 s` read as a miss by nothing)."""
    return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"


def _step_text(s: StepSlo) -> str:
    observed = ", ".join(f"{k} {seconds_text(v)}" for k, v in s.observed.items() if v is not None)
    if s.per_request:
        observed += f"; {', '.join(s.per_request)} from each request's own gap (gaps not saved)"
    if s.met is True:
        good = f", goodput {s.goodput_rps:.2f} req/s" if s.goodput_rps else ""
        return f"meets ({observed}{good})"
    if s.met is False:
        return f"misses ({observed}, {s.share * 100:.0f} % of requests within)"
    return f"not judged ({s.why_not_judged()})"


@dataclass(frozen=True)
class Decision:
    """The answer: a verdict per engine, the recommendation, and why. Frozen: a part decided
    later (the SLO's) makes a new decision (`dataclasses.replace`)."""

    # None: no load step measured the engine (unreached, stopped first): said `not measured`.
    verdict: dict[str, str | None]
    recommendation: str
    action: str
    comparable: bool
    steps: list[Step]
    caveats: list[str] = field(default_factory=list)
    estimates: list[Estimate] = field(default_factory=list)
    # compare: who is ahead at each measured concurrency, the first concurrency at which an
    # engine is ahead that was not at the first level (`crossover_from` is the level before
    # it), the user's load (--load) and the SLO's answer (--slo).
    loads: list[LoadAnswer] = field(default_factory=list)
    crossover: int | None = None
    load: int | None = None
    slo: SloAnswer | None = None
    # Where `load` came from: "--load", or the Prometheus query that read it (--load-from).
    load_source: str | None = None
    # The level before the crossover: the answer changes between `crossover_from` and
    # `crossover` (None: no crossover).
    crossover_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_text(self) -> str | None:
        """`c=12, the p90 of running requests ...`: the load the answer is for (None: none)."""
        if self.load is None:
            return None
        return f"c={self.load}, {self.load_source or '--load'}"


@dataclass
class RunInfo:
    """Who ran what, when: the metadata block of every report."""

    command: str
    tool_version: str
    started_at: str
    finished_at: str | None = None
    # The run stopped before its end (Ctrl-C, the engine lost): only the finished steps.
    partial: bool = False
