"""KV pressure: do long prompts in every slot fit in the KV cache?"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.decision.model import Row
from diagnose.steps.base import LoadStep, MeasureLoad, Say, StepOutcome, asked, not_measured

# The longest KV-pressure prompt chosen automatically: longer prompts cost minutes of prefill.
KV_PROMPT_CAP = 16384


@dataclass(frozen=True)
class KvInputs:
    """What the KV step reads: the options' lengths and concurrencies, the engine's slots."""

    kv_prompt_tokens: int | None  # --kv-prompt-tokens (None: chosen from the slot context)
    max_tokens: int
    concurrency: tuple[int, ...]
    slots: int | None
    slot_context: int | None


def kv_prompt_tokens(
    given: int | None, slot_context: int | None, max_tokens: int
) -> tuple[int | None, str]:
    """The KV step's prompt length and why (None: it cannot be chosen; `given`:
    --kv-prompt-tokens)."""
    if given is not None:
        return given, "--kv-prompt-tokens"
    ctx = slot_context
    if not ctx:
        return None, "the context per slot is unknown (pass --kv-prompt-tokens)"
    # Each request ends a little past half a slot's context: a pool that cannot hold
    # every slot at half its context runs out during decode, a per-slot one never does.
    tokens = min(ctx // 2, KV_PROMPT_CAP) - max_tokens // 2
    if tokens < 16:
        return None, f"a slot's context ({ctx}) leaves no room beyond --max-tokens"
    return tokens, f"ending past half of a slot's context ({ctx})"


# The row's KV figures the step's numbers show, under their own names.
KV_ROW_NUMBERS = ("truncated", "kv_exhausted", "kv_events", "kv_usage_max")


async def kv_outcome(measure: MeasureLoad, inputs: KvInputs, say: Say) -> StepOutcome:
    """One wave of long prompts, one per slot: completed, cut short, out of context, KV
    events and usage; flagged when the rules saw `kv_saturated`."""
    tokens, why = kv_prompt_tokens(inputs.kv_prompt_tokens, inputs.slot_context, inputs.max_tokens)
    if tokens == 0:
        return not_measured("kv_pressure", "skipped (--kv-prompt-tokens 0)", say)
    if tokens is None:
        return not_measured("kv_pressure", why, say)
    top = max(inputs.concurrency)
    conc = min(inputs.slots or top, top)
    # One wave, one request per slot: whatever waits, waits for KV space, not a slot.
    load = LoadStep("kv_pressure", conc, tokens, requests=conc)
    measured = await measure(load, note=f"{conc} x {tokens} prompt tokens")
    row = measured.row
    saturated = "kv_saturated" in measured.verdicts
    answer = kv_answer(row, tokens, why, saturated)
    say(answer)
    numbers: dict[str, object] = {"prompt_tokens": tokens, "concurrency": conc}
    numbers.update((name, getattr(row, name)) for name in KV_ROW_NUMBERS)
    return StepOutcome(asked("kv_pressure", answer, saturated, numbers))


def kv_answer(row: Row, tokens: int, why: str, saturated: bool) -> str:
    """The KV step's answer line."""
    pressure = row.kv_exhausted + row.truncated + row.kv_events
    return (
        f"{row.concurrency} requests of {tokens} prompt tokens ({why}): "
        f"{row.requests - row.requests_failed}/{row.requests} completed in full"
        f", {row.truncated} cut short, {row.kv_exhausted} 'context size exceeded', "
        f"{row.kv_events} KV events in the log"
        + (f", KV usage up to {row.kv_usage_max * 100:.0f} %" if row.kv_usage_max else "")
        + (f", {row.waiting_avg:.1f} waiting on average" if row.waiting_avg else "")
        + ("; the KV cache is full" if saturated or pressure else "; the KV cache holds them")
    )
