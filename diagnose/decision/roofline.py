"""The card's decode limit for what an engine measured: bytes per step, the physics gate.

Every number comes from the decision core's roofline (`core.roofline.decode_bytes_per_step`,
`roofline_tokens_per_second`, `roofline_misfit`); this module only picks the
inputs from an engine's `Facts` and rows and words the answer.
"""

from __future__ import annotations

from core.roofline import (
    MISFIT_BY_NAME,
    RooflineFacts,
    accepted_tokens,
    active_weights_bytes,
    decode_bytes_per_step,
    misfit_text,
    roofline_facts,
    roofline_misfit,
    roofline_tokens_per_second,
)
from diagnose.decision.model import EngineResult, Facts, Roofline, Row
from diagnose.decision.sources import source_note


def bytes_per_step(
    engine: Facts, kv_tokens: float | None, batch: float = 1.0
) -> tuple[float | None, float | None]:
    """(bytes per decode step, active weight bytes) of `engine` at `batch` sequences holding
    `kv_tokens` KV tokens: the decision core's formula, whatever the bandwidth's source."""
    model = engine.structure()
    if model is None:
        return None, None
    per_step = decode_bytes_per_step(
        model, kv_tokens, engine.kv_bytes_per_token, batch, engine.spec_accept_length
    )
    return per_step, active_weights_bytes(model, batch)


def facts(engine: Facts) -> RooflineFacts:
    """What the bytes-per-step model of `engine` knows (for the physics gate)."""
    model = engine.structure()
    return roofline_facts(model if model is not None else 0.0, engine.spec_accept_length)


def row_batch(engine: Facts, row: Row) -> int:
    """Sequences one decode step of `row` holds: its concurrency, at most the slots."""
    return max(1, min(row.concurrency, engine.slots or row.concurrency))


def roofline(engine: EngineResult) -> Roofline:
    """Single-request decode against the card's limit (bytes read per step, physics-gated)."""
    return row_roofline(engine, engine.single())


def row_roofline(engine: Facts, row: Row | None) -> Roofline:
    """One step's per-sequence decode against the card's limit at that step's batch."""
    kv_tokens = None
    batch = row_batch(engine, row) if row is not None else 1
    if row is not None and row.prompt_tokens is not None:
        # Each sequence holds its prompt plus, on average, half of its output in the KV.
        kv_tokens = batch * (row.prompt_tokens + row.max_tokens / 2)
    bw = engine.bandwidth_bytes_per_s
    per_step, active = bytes_per_step(engine, kv_tokens, float(batch))
    accept = engine.spec_accept_length
    limit = roofline_tokens_per_second(bw, per_step, accept)
    measured = row.per_seq_tok_s if row else None
    eff = measured / limit if measured and limit else None
    reason = roofline_misfit(eff, facts(engine))
    return Roofline(
        bw,
        engine.bandwidth_source,
        per_step,
        limit,
        measured,
        eff,
        active_weights_bytes=active,
        kv_bytes_per_token=engine.kv_bytes_per_token,
        accepted_tokens_per_step=accepted_tokens(accept) if per_step else None,
        misfit=reason.name if reason is not None else None,
    )


def roofline_text(roof: Roofline) -> str:
    """`, N % of the card's limit ... (bandwidth ÷ bytes per step)`, or why it does not fit."""
    if roof.efficiency is None or not roof.limit_tok_s:
        return ""
    accepted = roof.accepted_tokens_per_step or 1.0
    spec = f" × {accepted:.2f} accepted tokens per step" if accepted != 1.0 else ""
    basis = (
        f"bandwidth {(roof.bandwidth_bytes_per_s or 0) / 1e9:.0f} GB/s{spec} ÷ "
        f"{(roof.bytes_per_step or 0) / 2**30:.2f} GiB per step"
    )
    if roof.active_weights_bytes is not None:
        basis += f", {roof.active_weights_bytes / 2**30:.2f} GiB of it weights"
    if roof.misfit is not None:
        reason = MISFIT_BY_NAME[roof.misfit]
        return (
            f"; {misfit_text(roof.efficiency, reason)} (limit {roof.limit_tok_s:.1f} "
            f"tok/s from {basis})"
        )
    return (
        f", {roof.efficiency * 100:.0f} % of the card's limit {roof.limit_tok_s:.1f} tok/s "
        f"({basis})"
    )


def row_roofline_text(engine: Facts, row: Row) -> str:
    """`; per sequence X tok/s = N % of the limit L tok/s at B sequences (G GiB per step)`."""
    if row.per_seq_tok_s is None or row.limit_tok_s is None or row.efficiency is None:
        return ""
    head = (
        f"; per sequence {row.per_seq_tok_s:.1f} tok/s{source_note(row.per_seq_source)} "
        "against the limit "
        f"{row.limit_tok_s:.1f} tok/s at {row_batch(engine, row)} sequences "
        f"({(row.bytes_per_step or 0) / 2**30:.2f} GiB per step)"
    )
    if row.misfit is not None:
        return head + f": beyond physics ({row.misfit}), no decode claim"
    return head + f" = {row.efficiency * 100:.0f} %"


def roofline_fraction(engine: EngineResult) -> float | None:
    """Single-request decode as a share of the card's limit (None when unknown)."""
    return roofline(engine).efficiency


def roofline_tok_s(engine: EngineResult) -> float | None:
    """The card's per-sequence decode limit for this engine's model, tok/s."""
    return roofline(engine).limit_tok_s
