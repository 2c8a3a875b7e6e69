"""One load step through the load generator's scheduler, as a `Row` of the result.

Each round's typed run summary (`loadgen.summary.StepSummary`) is added up in one place
(`_add_round`, into the step's `_Rounds`); the `Row` is built from them once the rounds have
run, and its verdict evidence comes from `diagnose.evidence`. A row is a value: what is
learnt after it is made is a new row (`dataclasses.replace`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from config.kinds import engine_kind
from core import series as llmb
from core.stats import percentile
from diagnose.decision.model import Row
from diagnose.decision.prefill import (
    PromptTiming,
    histogram_split,
    row_prefill,
    ttft_split,
)
from diagnose.decision.roofline import row_roofline
from diagnose.decision.sources import figure
from diagnose.engine_run import EngineRun
from diagnose.evidence import step_evidence
from diagnose.facts import structure_facts
from diagnose.monitor import Monitor
from diagnose.steps.base import LoadStep, StepStopped
from loadgen.outcomes import EARLY_STOP
from loadgen.results import PROMPT_TOKENS_TOLERANCE, RequestRecord, prompt_tokens_off
from loadgen.scheduler.calibration import calibrate_first
from loadgen.scheduler.phase import ABORT_ENGINE_GONE, ABORT_NOT_ANSWERING
from loadgen.scheduler.spec import RunSpec
from loadgen.scheduler.step import run_step
from loadgen.summary import StepSummary
from loadgen.traffic.model import Traffic

# Error kinds that mean the KV cache / context ran out (the load generator's names).
KV_ERRORS = ("kv_exhausted",)
# The engine's own timing of a step, as the exporter maps it (SGLang: its TTFT histogram, and
# its inter-token histogram as the decode counters).


# Abort reasons of the scheduler after which no further step can run on this engine.
ENGINE_LOST = (ABORT_ENGINE_GONE, ABORT_NOT_ANSWERING)


def load_spec(
    run: EngineRun,
    concurrency: int,
    prompt_tokens: int,
    requests: int,
    traffic: Traffic | None = None,
) -> RunSpec:
    """The scheduler's spec of one round: completions, the options' lengths and timeouts.

    With `traffic` the round replays it (its lengths, times and shared blocks) and the
    engine's prompt cache stays on: a shared prefix is the traffic's, and so is its hit.
    """
    spec = RunSpec(
        targets=[run.target()],
        max_tokens=run.opts.max_tokens,
        concurrency=concurrency,
        requests=requests,
        prompt_tokens=prompt_tokens,
        timeout=run.opts.timeout,
        connect_timeout=run.opts.connect_timeout,
        endpoint="completions",
        extra_body=dict(engine_kind(run.engine.kind).uncached_body),
    )
    if traffic is not None:
        spec.traffic, spec.prompt_tokens, spec.requests = traffic, None, None
        spec.time_scale, spec.schedule = run.opts.time_scale, run.opts.schedule
        spec.extra_body = {}
    return spec


@dataclass
class _Rounds:
    """What the rounds of one step add up to, before its row is made: the counts, each
    round's figures and the per-round medians' inputs."""

    requests: int = 0
    requests_failed: int = 0
    completion_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    record_steps: list[int] = field(default_factory=list)
    aggregate: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    ttft_p99_s: float | None = None
    per_seq: list[float] = field(default_factory=list)
    late_sends: int | None = None
    send_error_p99_s: float | None = None
    server_ms: list[float] = field(default_factory=list)
    server_tok_s: list[float] = field(default_factory=list)
    prompts: list[float] = field(default_factory=list)
    timings: list[PromptTiming] = field(default_factory=list)
    # --traffic: requests whose usage is not the traffic's lengths (`traffic_off`).
    tokens_off: int = 0
    traffic: bool = False


def _add_round(acc: _Rounds, fig: StepSummary) -> None:
    """One round's run summary (the scheduler's typed `StepSummary`) added to the step's."""
    acc.requests_failed += fig.requests_failed
    for kind, n in fig.errors.items():
        acc.errors[kind] = acc.errors.get(kind, 0) + n
    acc.completion_tokens += fig.output_tokens_total
    if fig.output_tok_s is not None:
        acc.aggregate.append(fig.output_tok_s)
    if fig.ttft_p50_s is not None:
        acc.ttfts.append(fig.ttft_p50_s)
    if fig.ttft_p99_s is not None:
        acc.ttft_p99_s = max(acc.ttft_p99_s or 0.0, fig.ttft_p99_s)
    if fig.decode_tok_s_mean is not None:
        acc.per_seq.append(fig.decode_tok_s_mean)
    if fig.server_decode_tok_s_mean:
        acc.server_ms.append(1000.0 / fig.server_decode_tok_s_mean)
        acc.server_tok_s.append(fig.server_decode_tok_s_mean)
    # A scheduled replay: the sends the schedule could not keep (never shifted, counted).
    if fig.late_sends is not None:
        acc.late_sends = (acc.late_sends or 0) + fig.late_sends
    if fig.send_error_p99_s is not None:
        acc.send_error_p99_s = max(acc.send_error_p99_s or 0.0, fig.send_error_p99_s)


async def _run_rounds(
    run: EngineRun, row: Row, load: LoadStep
) -> tuple[_Rounds, StepStopped | None]:
    """The step's rounds; with why they stopped early (Ctrl-C, engine lost), else None."""
    acc = _Rounds(traffic=load.traffic is not None)
    for round_no in range(load.rounds):
        # Each round its own text for the traffic's blocks: a later round served from the
        # cache an earlier one filled would measure the cache, not the traffic.
        traffic = None if load.traffic is None else load.traffic.for_round(round_no)
        spec = load_spec(
            run,
            row.concurrency,
            load.prompt_tokens,
            load.requests or row.concurrency * run.opts.requests_per_slot,
            traffic,
        )
        result = await run_step(spec, run.ctx, step=run.round_no)
        acc.record_steps.append(run.round_no)
        run.round_no += 1
        records = result.records.get(run.engine.name, [])
        acc.requests += len(records)
        for summary in result.summaries[:1]:  # the round's only engine
            _add_round(acc, summary)
        acc.prompts += [float(r.prompt_tokens) for r in records if r.prompt_tokens is not None]
        reason = result.abort_reason or ""
        acc.timings += prompt_timings(records)
        if load.traffic is not None:
            acc.tokens_off += traffic_off(load.traffic, records)
        if result.interrupted:
            return acc, StepStopped(reason or "interrupted", interrupted=True)
        if result.aborted and reason.startswith(ENGINE_LOST):
            return acc, StepStopped(reason, interrupted=False)
    return acc, None


@dataclass(frozen=True)
class EngineTiming:
    """The engine's own per-sequence decode tok/s and mean TTFT over one step (None: none)."""

    decode_tok_s: float | None = None
    ttft_s: float | None = None
    # The mean time a request spent in the engine's waiting queue (SGLang's histogram).
    queue_s: float | None = None


def engine_timing(mon: Monitor, server_tok_s: list[float], t0: float, t1: float) -> EngineTiming:
    """A step's engine timing: decode from llama.cpp's per-request `timings` (the rounds'
    `server_tok_s`), else from the exporter's counters over [t0, t1] (SGLang's inter-token
    histogram); TTFT as the mean of the TTFT histogram over [t0, t1] (SGLang).

    llama.cpp's `prompt_ms` is no TTFT: it leaves out the wait for a slot and the request's
    way in, so a step without streamed text has no llama.cpp TTFT.
    """
    decode = median(server_tok_s) or _per(
        mon.increase(llmb.ENGINE_DECODE_TOKENS_TOTAL, t0, t1),
        mon.increase(llmb.ENGINE_DECODE_SECONDS_TOTAL, t0, t1),
    )
    ttft = _per(
        mon.increase(llmb.ENGINE_TIME_TO_FIRST_TOKEN_SECONDS + "_sum", t0, t1),
        mon.increase(llmb.ENGINE_TIME_TO_FIRST_TOKEN_SECONDS + "_count", t0, t1),
    )
    queue = _per(
        mon.increase(llmb.ENGINE_QUEUE_TIME_SECONDS + "_sum", t0, t1),
        mon.increase(llmb.ENGINE_QUEUE_TIME_SECONDS + "_count", t0, t1),
    )
    return EngineTiming(decode, ttft, queue)


def _per(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def mean_output(traffic: Traffic) -> int:
    """The traffic's mean output length in tokens, rounded."""
    return round(sum(r.output_tokens for r in traffic.requests) / len(traffic.requests))


def traffic_off(traffic: Traffic, records: list[RequestRecord]) -> int:
    """The answered requests whose usage is not what the traffic asked: output tokens other
    than its length, or a prompt further off its length than the load generator allows
    (`loadgen.results.PROMPT_TOKENS_TOLERANCE`, a chat template's merged token)."""
    off = 0
    for r in records:
        if r.error is not None and r.error != EARLY_STOP:
            continue  # a failure, counted as one
        asked = traffic.requests[r.index]
        prompt_off = prompt_tokens_off(r)
        if r.completion_tokens != asked.output_tokens or (
            prompt_off is None or abs(prompt_off) > PROMPT_TOKENS_TOLERANCE
        ):
            off += 1
    return off


def _summarize(run: EngineRun, base: Row, acc: _Rounds, engine: EngineTiming) -> Row:
    """The step's row: `base` (what was asked) with what its rounds measured."""
    ok = acc.requests - acc.requests_failed
    # --traffic asks each request's own output length: checked request by request.
    asked = (
        acc.tokens_off == 0 if acc.traffic else acc.completion_tokens == ok * run.opts.max_tokens
    )
    # The client's figures, else the engine's own (a stream of empty text): one decision.
    ttft = figure(median(acc.ttfts), engine.ttft_s)
    decode = figure(median(acc.per_seq), engine.decode_tok_s)
    error = None
    if ok == 0:
        error = f"{acc.requests_failed}/{acc.requests} requests failed: " + ", ".join(
            f"{k} {n}" for k, n in sorted(acc.errors.items())
        )
    row = replace(
        base,
        requests=acc.requests,
        requests_failed=acc.requests_failed,
        completion_tokens=acc.completion_tokens,
        errors=dict(acc.errors),
        record_steps=list(acc.record_steps),
        aggregate_rounds=list(acc.aggregate),
        ttft_rounds=list(acc.ttfts),
        per_seq_rounds=list(acc.per_seq),
        ttft_p99_s=acc.ttft_p99_s,
        late_sends=acc.late_sends,
        send_error_p99_s=acc.send_error_p99_s,
        tokens_ok=ok > 0 and asked and not acc.requests_failed,
        tokens_off=acc.tokens_off,
        prompt_tokens=sum(acc.prompts) / len(acc.prompts) if acc.prompts else None,
        aggregate_tok_s=median(acc.aggregate),
        ttft_s=ttft.value,
        ttft_source=ttft.source,
        per_seq_tok_s=decode.value,
        per_seq_source=decode.source,
        per_token_ms=1000.0 / decode.value if decode.value else None,
        server_per_token_ms=median(acc.server_ms),
        # KV pressure: cut requests (early stop = truncated by the engine), KV errors.
        kv_exhausted=sum(acc.errors.get(k, 0) for k in KV_ERRORS),
        truncated=acc.errors.get("early_stop", 0),
        error=error,
    )
    roof = row_roofline(run.facts, row)
    row = replace(row, bytes_per_step=roof.bytes_per_step, limit_tok_s=roof.limit_tok_s,
                  efficiency=roof.efficiency, misfit=roof.misfit)  # fmt: skip
    split = ttft_split(acc.timings) or histogram_split(engine.ttft_s, engine.queue_s)
    if split is None:
        return row
    row = replace(row, prefill_tok_s=split.prefill_tok_s, queue_wait_s=split.queue_wait_s,
                  prefill_s=split.prefill_s, ttft_split_source=split.source)  # fmt: skip
    return replace(row, prefill_efficiency=row_prefill(run.facts, row).efficiency)


def prompt_timings(records: list[RequestRecord]) -> list[PromptTiming]:
    """The engine's prompt timings of a round's requests (llama.cpp `timings`)."""
    return [
        PromptTiming(
            r.start_time + r.ttft_s, r.ttft_s, float(r.server_prompt_ms), float(r.server_prompt_n)
        )
        for r in records
        if r.error is None
        and r.ttft_s is not None
        and r.server_prompt_ms is not None
        and r.server_prompt_n is not None
    ]


async def measure_row(run: EngineRun, load: LoadStep) -> Row:
    """One load step through the scheduler, `load.rounds` times; the row keeps every round."""
    asked = Row(
        run.engine.name,
        load.key,
        load.concurrency,
        context=load.context,
        parallel=run.facts.slots,
        # --traffic: each request asks the traffic's own length; the row keeps their mean
        # (the KV estimates' mid-decode context).
        max_tokens=run.opts.max_tokens if load.traffic is None else mean_output(load.traffic),
    )
    # The prompts are counted before the step's window opens: the calibration probes would
    # be in the engine's own TTFT histogram over the window (diagnose/decision/sources.py).
    spec = load_spec(run, load.concurrency, load.prompt_tokens, 1, load.traffic)
    await calibrate_first(run.ctx, spec)
    t0 = time.time()
    # The step's window opens with a scrape of its own: every counter's value before the
    # first request (the background sampler's next scrape may come after it finished, and
    # a step seen by one scrape has no rate: `idle`, no decode efficiency).
    await run.monitor.sample(fresh=True)
    events0 = _log_events(run)
    started = time.time()
    acc, stopped = await _run_rounds(run, asked, load)
    asked = replace(asked, wall_s=time.time() - started)
    if stopped is not None:
        # What finished is kept: the row with its rounds, marked with why it stopped.
        timing = engine_timing(run.monitor, acc.server_tok_s, t0, time.time())
        row = _summarize(run, asked, acc, timing)
        run.rows.append(replace(row, error=f"stopped: {stopped.reason}"))
        raise stopped
    # llama.cpp logs a slot's release (and its truncation) after the stream has ended:
    # one more sample interval lets the log and the exporter catch up with the step.
    await asyncio.sleep(run.opts.sample_interval)
    await run.monitor.sample(fresh=True)
    t1 = time.time()
    # Series that appear only once requests finished (the speculative accept length).
    run.facts = structure_facts(run)
    row = replace(
        _summarize(run, asked, acc, engine_timing(run.monitor, acc.server_tok_s, t0, t1)),
        memory_bytes=run.monitor.memory_peak(t0, t1),
        prompt_cache_hit_ratio=(
            cache_hit_ratio(run.monitor, t0, t1) if load.traffic is not None else None
        ),
        # The KV-pressure events the engine's log showed during the step (the exporter's).
        kv_events=int(max(0.0, _log_events(run) - events0)),
    )
    row = step_evidence(run, row, t0, t1)
    run.rows.append(row)
    return row


def cache_hit_ratio(mon: Monitor, t0: float, t1: float) -> float | None:
    """Cached / all prompt tokens over [t0, t1] from the engine's own counters (None: no
    counters, or no prompt tokens). Not SGLang's `cache_hit_rate` gauge: each batch
    overwrites it, so a scrape sees one batch, not the step."""
    return _per(
        mon.increase(llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL, t0, t1),
        mon.increase(llmb.ENGINE_PROMPT_TOKENS_TOTAL, t0, t1),
    )


def _log_events(run: EngineRun) -> float:
    """KV-pressure events of the engine's log so far (SGLang's retractions are no log events)."""
    if not engine_kind(run.engine.kind).kv_events_in_log:
        return 0.0
    return run.monitor.engine_total(llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL)


def median(values: list[float]) -> float | None:
    """The median (None of nothing)."""
    return percentile(values, 50)
