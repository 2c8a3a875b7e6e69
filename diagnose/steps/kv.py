"""KV pressure: do long prompts in every slot fit in the KV cache?"""

from __future__ import annotations

from diagnose.decision.model import Row, Step
from diagnose.engine_run import EngineRun, LoadStep
from diagnose.step_table import STEP_QUESTIONS

# The longest KV-pressure prompt chosen automatically: longer prompts cost minutes of prefill.
KV_PROMPT_CAP = 16384


def kv_prompt_tokens(run: EngineRun) -> tuple[int | None, str]:
    """The KV step's prompt length and why (None: it cannot be chosen)."""
    if run.opts.kv_prompt_tokens is not None:
        return run.opts.kv_prompt_tokens, "--kv-prompt-tokens"
    ctx = run.result.slot_context
    if not ctx:
        return None, "the context per slot is unknown (pass --kv-prompt-tokens)"
    # Each request ends a little past half a slot's context: a pool that cannot hold
    # every slot at half its context runs out during decode, a per-slot one never does.
    tokens = min(ctx // 2, KV_PROMPT_CAP) - run.opts.max_tokens // 2
    if tokens < 16:
        return None, f"a slot's context ({ctx}) leaves no room beyond --max-tokens"
    return tokens, f"ending past half of a slot's context ({ctx})"


class KvPressureStep:
    """One wave of long prompts, one per slot; flagged when the rules saw `kv_saturated`."""

    key = "kv_pressure"

    async def measure(self, run: EngineRun) -> Step:
        """Completed, cut short, out of context, KV events and usage of the wave."""
        tokens, why = kv_prompt_tokens(run)
        if tokens == 0:
            return run.not_measured("kv_pressure", "skipped (--kv-prompt-tokens 0)")
        if tokens is None:
            return run.not_measured("kv_pressure", why)
        top = max(run.opts.concurrency)
        conc = min(run.result.slots or top, top)
        with run.phase("kv_pressure", note=f"{conc} x {tokens} prompt tokens"):
            # One wave, one request per slot: whatever waits, waits for KV space, not a slot.
            row = await run.load_row(LoadStep("kv_pressure", conc, tokens, requests=conc))
        saturated = any(v == "kv_saturated" for s, v, _ in run.step_verdicts if s == "kv_pressure")
        answer = kv_answer(row, tokens, why, saturated)
        run.say("kv_pressure", answer)
        numbers: dict[str, object] = {
            "prompt_tokens": tokens,
            "concurrency": conc,
            "truncated": row.truncated,
            "kv_exhausted": row.kv_exhausted,
            "kv_events": row.kv_events,
            "kv_usage_max": row.kv_usage_max,
        }
        return Step("kv_pressure", STEP_QUESTIONS["kv_pressure"], answer, saturated, numbers)


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
