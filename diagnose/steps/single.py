"""Single-request decode: per-sequence speed against the card's memory-bandwidth roofline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from diagnose.decision.model import NOT_MEASURED, Prefill, Roofline
from diagnose.decision.prefill import prefill_text, split_text
from diagnose.decision.roofline import roofline_text
from diagnose.decision.sources import decode_text
from diagnose.steps.base import LoadStep, MeasureLoad, Say, StepOutcome, asked


@dataclass(frozen=True)
class SingleFigures:
    """The engine's roofline and prompt figures, read once the single row is measured (the
    row's load brings series such as the speculative accept length)."""

    roofline: Roofline
    prefill: Prefill


async def single_outcome(
    measure: MeasureLoad,
    figures: Callable[[], SingleFigures],
    prompt_tokens: int,
    rounds: int,
    say: Say,
) -> StepOutcome:
    """One request at a time: the decode answer with its roofline figures (never flagged:
    the verdict decides)."""
    row = (await measure(LoadStep("single", 1, prompt_tokens, rounds))).row
    fig = figures()
    roof = fig.roofline
    decode = decode_text(row)
    if row.error or decode is None:
        answer = f"failed: {row.error}" if row.error else NOT_MEASURED + "no decode timings"
    else:
        answer = decode
        if roof.limit_tok_s and roof.efficiency is not None:
            answer += roofline_text(roof)
        else:
            answer += "; roofline unknown: pass --bandwidth-gbs (no GPU bandwidth known)"
    if not row.error:
        answer += "; " + prefill_text(fig.prefill) + split_text(row)
    say(answer)
    numbers: dict[str, object] = {
        "per_seq_tok_s": row.per_seq_tok_s,
        "per_seq_source": row.per_seq_source,
        "roofline_tok_s": roof.limit_tok_s,
        "efficiency": roof.efficiency,
        "bytes_per_step": roof.bytes_per_step,
        "active_weights_bytes": roof.active_weights_bytes,
        "accepted_tokens_per_step": roof.accepted_tokens_per_step,
        "misfit": roof.misfit,
        "rounds": row.per_seq_rounds,
        "prefill": fig.prefill,
    }
    return StepOutcome(asked("single", answer, False, numbers))
