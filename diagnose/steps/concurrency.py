"""Concurrency: does aggregate throughput grow with the requests in flight, do they queue?"""

from __future__ import annotations

from diagnose.decision.model import Row, Step
from diagnose.decision.prefill import split_text
from diagnose.decision.roofline import row_roofline_text
from diagnose.decision.sources import ttft_text
from diagnose.engine_run import EngineRun, LoadStep
from diagnose.step_table import STEP_QUESTIONS
from loadgen.traffic.model import Traffic


class ConcurrencyStep:
    """One load step per --concurrency above 1; flagged when the rules saw a queue."""

    key = "concurrency"

    async def measure(self, run: EngineRun) -> Step:
        """Each level's aggregate, TTFT and queue; whether requests queue for a slot."""
        if run.opts.traffic is not None:
            return await traffic_step(run, run.opts.traffic)
        levels = [c for c in run.opts.concurrency if c > 1]
        if not levels:
            return run.not_measured("concurrency", "no --concurrency above 1")
        parts = []
        for c in levels:
            with run.phase("concurrency", note=f"concurrency {c}"):
                row = await run.load_row(
                    LoadStep("concurrency", c, run.opts.prompt_tokens, run.opts.rounds)
                )
            if row.error:
                parts.append(f"c={c} failed ({row.error})")
                continue
            parts.append(level_text(run, c, row))
            run.say("concurrency", parts[-1])
        if run.opts.find_max and run.opts.slo is not None:
            parts.append(await run.find_max(run.opts.slo))
            run.say("concurrency", parts[-1])
        queued = any(v == "scheduling_bound" for s, v, _ in run.step_verdicts if s == "concurrency")
        slots = f" ({run.result.slots} slots)" if run.result.slots else ""
        return Step(
            "concurrency",
            STEP_QUESTIONS["concurrency"],
            "; ".join(parts) + (f"; requests queue for a slot{slots}" if queued else ""),
            queued,
        )


def level_text(run: EngineRun, c: int, row: Row) -> str:
    """One level's line: aggregate (and its scale over one sequence), TTFT, queue, roofline."""
    single = run.result.single()
    scale = (
        f" (x{row.aggregate_tok_s / single.per_seq_tok_s:.2f} of one sequence)"
        if single and single is not row and single.per_seq_tok_s and row.aggregate_tok_s
        else ""
    )
    queue = f", {row.waiting_avg:.1f} waiting on average" if row.waiting_avg else ""
    return (
        f"c={c}: {row.aggregate_tok_s or 0:.1f} tok/s aggregate{scale}, {ttft_text(row)}"
        f"{split_text(row)}{queue}{row_roofline_text(run.result, row)}"
    )


async def traffic_step(run: EngineRun, traffic: Traffic) -> Step:
    """--traffic: the traffic replayed `--rounds` times, one row at its width; flagged when
    the rules saw a queue."""
    width = run.opts.traffic_width()
    with run.phase("concurrency", note=f"traffic {traffic.source}"):
        row = await run.load_row(
            LoadStep("concurrency", width, 0, run.opts.rounds, traffic=traffic)
        )
    if row.error:
        return Step(
            "concurrency", STEP_QUESTIONS["concurrency"], f"your traffic failed ({row.error})"
        )
    answer = "your traffic, " + level_text(run, width, row) + traffic_text(row)
    run.say("concurrency", answer)
    queued = any(v == "scheduling_bound" for s, v, _ in run.step_verdicts if s == "concurrency")
    numbers: dict[str, object] = {
        "prompt_cache_hit_ratio": row.prompt_cache_hit_ratio,
        "kv_usage_max": row.kv_usage_max,
        "waiting_avg": row.waiting_avg,
        "tokens_off": row.tokens_off,
    }
    return Step("concurrency", STEP_QUESTIONS["concurrency"], answer, queued, numbers)


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
    return f"; {cache}{kv}; {tokens}"


def traffic_row_text(row: Row) -> str:
    """An engine's traffic row in one line (compare's answer): aggregate, TTFT and its
    split, queue, prefix cache, KV usage, the token check."""
    queue = f", {row.waiting_avg:.1f} waiting on average" if row.waiting_avg is not None else ""
    return (
        f"{row.aggregate_tok_s or 0:.1f} tok/s aggregate, {ttft_text(row)}{split_text(row)}"
        f"{queue}{traffic_text(row)}"
    )
