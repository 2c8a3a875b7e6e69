"""`llmb-loadgen compare --engine A --engine B`: the same requests against two engines.

The engines are measured one after the other (on one GPU they cannot both hold their
weights), each through the whole `diagnose` procedure, with the same prompt text
(calibrated once, on the first engine), the same max tokens, temperature 0 and ignore_eos,
the same concurrencies and `--rounds` rounds of every load step. Then, in the seed's order:
residency, comparability (weight bytes per parameter within 20 %, else the per-roofline
comparison and a labelled estimate at the other's precision), single-request decode,
batching at every measured concurrency (aggregate tok/s and TTFT at equal load), and where
each engine's memory gives out. A difference is called only when it exceeds the spread
between rounds. A is the engine in use; the recommendation is `stay_and_tune`,
`switch_to:B`, `fix_memory_first` or `inconclusive`. The command line is `diagnose.cli`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from config.settings import EngineConfig
from diagnose.decision.model import Decision, EngineResult, Row
from diagnose.decision.two_engines import decide_compare
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.procedure import Diagnoser
from loadgen.scheduler.context import RunContext

DEFAULT_ROUNDS = 3


def token_count_differences(a: EngineResult, b: EngineResult) -> list[str]:
    """Differences in prompt/completion token counts between rows of the same step."""
    out = []

    def key(r: Row) -> tuple[str, int, int | None]:
        # Only the context sweep is matched on context: elsewhere it is each engine's default.
        return (r.step, r.concurrency, r.context if r.step == "context" else None)

    rows_b = {key(r): r for r in b.ok_rows()}
    for ra in a.ok_rows():
        rb = rows_b.get(key(ra))
        if rb is None or ra.step == "kv_pressure":
            # The KV step's prompt follows each engine's own slot context.
            continue
        if ra.completion_tokens != rb.completion_tokens:
            out.append(
                f"{ra.step} c={ra.concurrency}: generated tokens differ "
                f"({a.name} {ra.completion_tokens}, {b.name} {rb.completion_tokens})"
            )
        if ra.prompt_tokens and rb.prompt_tokens and abs(ra.prompt_tokens - rb.prompt_tokens) > 0.5:
            out.append(
                f"{ra.step} c={ra.concurrency}: the same prompt is {ra.prompt_tokens:.0f} tokens "
                f"on {a.name} and {rb.prompt_tokens:.0f} on {b.name} (different tokenizers)"
            )
    return out


async def compare(
    engines: tuple[EngineConfig, EngineConfig],
    opts: Options,
    out: Path,
    pub: PhasePublisher | None = None,
) -> tuple[list[EngineResult], Decision]:
    """Measure both engines with identical requests and decide."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    pub = pub or PhasePublisher()
    # One run context: the prompts calibrated on A are sent byte for byte to B.
    ctx = RunContext(out)
    try:
        results = []
        for engine in engines:
            results.append(await Diagnoser(engine, opts, out, pub, ctx).run())
    finally:
        ctx.close()
    ra, rb = results
    decision = decide_compare(ra, rb)
    decision.caveats += token_count_differences(ra, rb)
    return results, decision
