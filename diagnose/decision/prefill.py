"""The card's prefill limit for what an engine measured, and the time before the first token
split into waiting and work, from the engine's own prompt timings.

Every number of the limit comes from the decision core (`core.prefill`); this module picks
the inputs from an engine's `Facts` and a step's requests and words the answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from core.card import clock_scale, clock_scaled_peak
from core.prefill import (
    PrefillStructure,
    busy_seconds,
    prefill_efficiency,
    prefill_flops_per_token,
    prefill_limit_tokens_per_second,
    prefill_misfit_text,
    prefill_physical,
    prefill_tokens_per_second,
)
from diagnose.decision.model import Facts, Prefill, Row


@dataclass(frozen=True)
class PromptTiming:
    """One request as the engine timed its prompt: when its first token came (unix s), its
    TTFT as the client saw it, and the engine's prompt milliseconds and prompt tokens."""

    first_token_at: float
    ttft_s: float
    prompt_ms: float
    prompt_n: float


@dataclass(frozen=True)
class TtftSplit:
    """A step's prompts: prompt tok/s while prompts were being computed
    (`core.prefill.prefill_tokens_per_second`), and the mean time before the first token split
    into waiting and computing the prompt."""

    prefill_tok_s: float | None
    queue_wait_s: float
    prefill_s: float
    source: str = "requests"


def ttft_split(timings: Iterable[PromptTiming]) -> TtftSplit | None:
    """The split from the engine's own prompt time of each request: computing is its
    `prompt_ms`, waiting the rest of its TTFT. Prompts computed together in one batch each
    count their whole prompt time as computing, never as waiting. Prompt tok/s: the prompt
    tokens computed over the union of the prompt spans (each ending at its first token).
    None without the engine's prompt timings."""
    rows = [t for t in timings if t.prompt_ms > 0 and t.prompt_n > 0]
    if not rows:
        return None
    spans = [(t.first_token_at - t.prompt_ms / 1e3, t.first_token_at) for t in rows]
    speed = prefill_tokens_per_second(sum(t.prompt_n for t in rows), busy_seconds(spans))
    work = [t.prompt_ms / 1e3 for t in rows]
    wait = [max(t.ttft_s - w, 0.0) for t, w in zip(rows, work, strict=True)]
    return TtftSplit(speed, sum(wait) / len(wait), sum(work) / len(work))


def histogram_split(ttft_s: float | None, queue_s: float | None) -> TtftSplit | None:
    """The split from the engine's own histograms over a step where it times no request's
    prompt for the client (SGLang): waiting is the mean of its queue-time histogram, computing
    the rest of the mean of its TTFT histogram (both per request, from admission). No prompt
    tok/s: a histogram has no spans to take the union of. None without both."""
    if ttft_s is None or queue_s is None:
        return None
    return TtftSplit(None, queue_s, max(ttft_s - queue_s, 0.0), "histograms")


def structure(engine: Facts) -> PrefillStructure | None:
    """The model's FLOPs per prompt token as the core knows them (None when unknown)."""
    p = engine.prefill
    if not p.matmul_flops:
        return None
    return PrefillStructure(
        p.matmul_flops,
        p.attention_flops_full or 0.0,
        p.attention_flops_swa or 0.0,
        p.sliding_window,
    )


def row_prefill(engine: Facts, row: Row | None) -> Prefill:
    """One step's prompts against the card's compute limit at that step's prompt length."""
    model = structure(engine)
    base = engine.prefill
    if model is None or row is None:
        return base
    flops = prefill_flops_per_token(model, row.prompt_tokens)
    # At the SM clock the step ran at, as the rules take it (`core.card.clock_scaled_peak`).
    peak = (
        None if base.peak_flops is None else clock_scaled_peak(base.peak_flops, row.sm_clock_ratio)
    )
    limit = prefill_limit_tokens_per_second(peak, flops)
    eff = prefill_efficiency(row.prefill_tok_s, limit)
    return replace(
        base,
        flops_per_token=flops,
        limit_tok_s=limit,
        measured_tok_s=row.prefill_tok_s,
        efficiency=eff,
        prompt_tokens=row.prompt_tokens,
        misfit=not prefill_physical(eff),
        sm_clock_ratio=row.sm_clock_ratio if clock_scale(row.sm_clock_ratio) < 1 else None,
    )


def prefill_row(rows: list[Row]) -> Row | None:
    """The step whose prompts stand for the engine: one request at a time, longest prompt."""
    timed = [r for r in rows if r.error is None and r.prefill_tok_s]
    pick = [r for r in timed if r.concurrency == 1] or timed
    return max(pick, key=lambda r: r.prompt_tokens or 0.0) if pick else None


def split_text(row: Row) -> str:
    """` (mean per request: waiting W s, prompt P s at N tok/s)` (the TTFT split), its source
    where it is not each request's own prompt time, or '' without one. Means, beside a TTFT
    p50: with spread prompt lengths (a traffic mix) the two differ, and W + P is the mean."""
    if row.queue_wait_s is None or row.prefill_s is None:
        return ""
    speed = f" at {row.prefill_tok_s:.0f} tok/s" if row.prefill_tok_s is not None else ""
    source = (
        ": the means of the engine's queue-time and TTFT histograms over the step"
        if row.ttft_split_source == "histograms"
        else ""
    )
    split = f"waiting {row.queue_wait_s:.3f} s, prompt {row.prefill_s:.3f} s"
    return f" (mean per request: {split}{speed}{source})"


def prefill_text(p: Prefill) -> str:
    """`prefill N tok/s = E % of the card's compute limit L tok/s (...)`, or why not."""
    if p.measured_tok_s is None:
        return "prefill: not measured (the engine returned no prompt timings)"
    head = f"prefill {p.measured_tok_s:.0f} tok/s"
    if p.efficiency is None or p.limit_tok_s is None or p.flops_per_token is None:
        why = (
            "no peak compute known: pass --peak-tflops"
            if p.flops_per_token
            else ("the model's FLOPs per token are unknown")
        )
        return f"{head}; compute limit unknown ({why})"
    peak = (p.peak_flops or 0) / 1e12
    at_clock = (
        f"{peak * p.sm_clock_ratio:.1f} TFLOP/s at the SM clock under load "
        f"({p.sm_clock_ratio:.0%} of its maximum; {peak:.1f} at the maximum)"
        if p.sm_clock_ratio is not None and p.sm_clock_ratio < 1
        else f"{peak:.1f} TFLOP/s"
    )
    basis = (
        f"{at_clock} ÷ {p.flops_per_token / 1e9:.3f} GFLOP per token at "
        f"{p.prompt_tokens or 0:.0f}-token prompts"
    )
    if p.misfit:
        return f"{head}; {prefill_misfit_text(p.efficiency)} (limit {p.limit_tok_s:.0f} tok/s)"
    return (
        f"{head} = {p.efficiency * 100:.0f} % of the card's compute limit "
        f"{p.limit_tok_s:.0f} tok/s ({basis})"
    )
