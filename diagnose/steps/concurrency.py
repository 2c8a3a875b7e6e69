"""Concurrency: does aggregate throughput grow with the requests in flight, do they queue?"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.slo import Slo
from diagnose.decision.model import Row
from diagnose.decision.prefill import split_text
from diagnose.decision.sources import ttft_text
from diagnose.steps.base import LoadStep, MeasureLoad, Say, StepOutcome, asked, not_measured
from loadgen.traffic.model import Traffic


@dataclass(frozen=True)
class Probed:
    """--find-max's answer line and the decision core's verdicts at the end of its probes."""

    text: str
    verdicts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConcurrencyInputs:
    """What the concurrency step reads: the options' load, the engine's slots, the single
    row (for the scale over one sequence) and --find-max's SLO (None: no search)."""

    concurrency: tuple[int, ...]
    prompt_tokens: int
    rounds: int
    slots: int | None = None
    single: Row | None = None
    find_max_slo: Slo | None = None
    traffic: Traffic | None = None
    traffic_width: int = 1


@dataclass(frozen=True)
class ConcurrencySeams:
    """How the concurrency step measures: a load step, --find-max's search, and a row's
    roofline line (the engine's facts at that row's batch)."""

    measure: MeasureLoad
    find_max: Callable[[Slo], Awaitable[Probed]]
    roofline_text: Callable[[Row], str]
    say: Say


async def concurrency_outcome(seams: ConcurrencySeams, inputs: ConcurrencyInputs) -> StepOutcome:
    """One load step per --concurrency above 1 (or the --traffic replay): each level's
    aggregate, TTFT and queue; flagged when the rules saw a queue."""
    if inputs.traffic is not None:
        return await traffic_outcome(seams, inputs, inputs.traffic)
    levels = [c for c in inputs.concurrency if c > 1]
    if not levels:
        return not_measured("concurrency", "no --concurrency above 1", seams.say)
    parts = []
    verdicts: list[str] = []
    for c in levels:
        load = LoadStep("concurrency", c, inputs.prompt_tokens, inputs.rounds)
        measured = await seams.measure(load, note=f"concurrency {c}")
        verdicts += measured.verdicts
        row = measured.row
        if row.error:
            parts.append(f"c={c} failed ({row.error})")
            continue
        parts.append(level_text(inputs.single, c, row, seams.roofline_text(row)))
        seams.say(parts[-1])
    if inputs.find_max_slo is not None:
        probed = await seams.find_max(inputs.find_max_slo)
        verdicts += probed.verdicts
        parts.append(probed.text)
        seams.say(parts[-1])
    queued = "scheduling_bound" in verdicts
    slots = f" ({inputs.slots} slots)" if inputs.slots else ""
    answer = "; ".join(parts) + (f"; requests queue for a slot{slots}" if queued else "")
    return StepOutcome(asked("concurrency", answer, queued))


def level_text(single: Row | None, c: int, row: Row, roofline: str) -> str:
    """One level's line: aggregate (and its scale over one sequence), TTFT, queue, and the
    row's `roofline` line."""
    scale = (
        f" (x{row.aggregate_tok_s / single.per_seq_tok_s:.2f} of one sequence)"
        if single and single is not row and single.per_seq_tok_s and row.aggregate_tok_s
        else ""
    )
    queue = f", {row.waiting_avg:.1f} waiting on average" if row.waiting_avg else ""
    return (
        f"c={c}: {row.aggregate_tok_s or 0:.1f} tok/s aggregate{scale}, {ttft_text(row)}"
        f"{split_text(row)}{queue}{roofline}"
    )


async def traffic_outcome(
    seams: ConcurrencySeams, inputs: ConcurrencyInputs, traffic: Traffic
) -> StepOutcome:
    """--traffic: the traffic replayed `--rounds` times, one row at its width; flagged when
    the rules saw a queue."""
    width = inputs.traffic_width
    load = LoadStep("concurrency", width, 0, inputs.rounds, traffic=traffic)
    measured = await seams.measure(load, note=f"traffic {traffic.source}")
    row = measured.row
    if row.error:
        return StepOutcome(asked("concurrency", f"your traffic failed ({row.error})"))
    level = level_text(inputs.single, width, row, seams.roofline_text(row))
    answer = "your traffic, " + level + traffic_text(row)
    seams.say(answer)
    queued = "scheduling_bound" in measured.verdicts
    numbers: dict[str, object] = {
        "prompt_cache_hit_ratio": row.prompt_cache_hit_ratio,
        "kv_usage_max": row.kv_usage_max,
        "waiting_avg": row.waiting_avg,
        "tokens_off": row.tokens_off,
    }
    return StepOutcome(asked("concurrency", answer, queued, numbers))


def traffic_text(row: Row) -> str:
    """The traffic row's cache, KV and token check: `; prefix cache 42 % of prompt tokens...`."""
    cache = (
        f"prefix cache {row.prompt_cache_hit_ratio:.0%} of prompt tokens (engine counters)"
        if row.prompt_cache_hit_ratio is not None
        else "prefix cache unknown (no prompt-token counters)"
    )
    kv = f", KV usage up to {row.kv_usage_max:.0%}" if row.kv_usage_max is not None else ""
    tokens = (
        "every request's usage as the traffic asked"
        if row.tokens_ok
        else f"{row.tokens_off} requests' usage differs from the traffic's lengths"
    )
    return f"; {cache}{kv}; {tokens}{late_text(row)}"


def late_text(row: Row) -> str:
    """`; 32 of 40 requests sent late ...` when a scheduled replay could not keep its times:
    their wait before the send is in no TTFT, so the figures flatter the engine."""
    if not row.late_sends:
        return ""
    p99 = f", p99 {row.send_error_p99_s:.2f} s" if row.send_error_p99_s is not None else ""
    return (
        f"; {row.late_sends} of {row.requests} requests sent later than the trace's times "
        f"({row.concurrency} in flight at most{p99}): their TTFT and end-to-end time count "
        "from the send, not from the trace's time, so they leave that wait out; raise "
        "--concurrency (the cap) to send them on time"
    )


def traffic_row_text(row: Row) -> str:
    """An engine's traffic row in one line (compare's answer): aggregate, TTFT and its
    split, queue, prefix cache, KV usage, the token check."""
    queue = f", {row.waiting_avg:.1f} waiting on average" if row.waiting_avg is not None else ""
    return (
        f"{row.aggregate_tok_s or 0:.1f} tok/s aggregate, {ttft_text(row)}{split_text(row)}"
        f"{queue}{traffic_text(row)}"
    )
