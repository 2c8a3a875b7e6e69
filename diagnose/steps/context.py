"""Long context: restart with only the context changed; where does memory give out?"""

from __future__ import annotations

from dataclasses import replace

from core.thresholds import threshold_number
from diagnose.decision.model import Row, Step
from diagnose.decision.prefill import row_prefill
from diagnose.engine_run import EngineRun, LoadStep, StepStopped, gib
from diagnose.step_table import STEP_QUESTIONS
from loadgen.client import TargetUnreachable


def contexts(run: EngineRun) -> tuple[list[int], str]:
    """The contexts to restart at, or [] and why not."""
    res = run.result
    if run.engine.launch is None:
        return [], "the engine was already running (no launch template to restart it)"
    if "ctx" not in run.template():
        return [], "the launch template has no {ctx} placeholder"
    if run.opts.contexts is not None:
        given = run.opts.contexts[1:] if run.opts.contexts else []
        return given, "" if given else "no further --contexts given"
    top = run.opts.max_context or res.trained_context
    if not top:
        return [], "the model's trained context is unknown (pass --contexts or --max-context)"
    start = run.launched_ctx or res.slot_context or 4096
    out = []
    ctx = start * 2
    while ctx < top:
        out.append(ctx)
        ctx *= 2
    out.append(top)
    out = [c for c in out if c > start]
    why = "" if out else f"the launch context {start} already reaches the top ({top})"
    return out, why


def launch_context_row(run: EngineRun) -> None:
    """The launch at the first --contexts value counts as the sweep's first row."""
    if not (run.opts.contexts and "ctx" in run.template()):
        return
    single = run.result.single()
    if single is None:
        return
    row = replace(single, step="context", context=run.opts.contexts[0],
                  aggregate_rounds=[], ttft_rounds=[], per_seq_rounds=[])  # fmt: skip
    row.loaded_memory_bytes = run.loaded_memory
    row.load_seconds = run.current.load_seconds if run.current else None
    row.kv_bytes = run.kv_bytes()
    run.result.rows.append(row)


class ContextStep:
    """The context sweep; flagged when memory (or the engine) gave out."""

    key = "context"

    async def measure(self, run: EngineRun) -> Step:
        """The first launch's row, then a restart per context until one gives out."""
        launch_context_row(run)
        run.stop()
        tried, why = contexts(run)
        if not tried and not any(r.step == "context" for r in run.result.rows):
            return run.not_measured("context", why)
        gave_out: int | None = None
        for ctx in tried:
            if not await context_step(run, ctx):
                gave_out = ctx
                break
        loaded = [r.context for r in run.result.ok_rows("context") if r.context]
        best = max(loaded) if loaded else None
        answer = (
            f"memory gives out at {gave_out} tokens (largest context loaded: {best})"
            if gave_out
            else f"every context loaded up to {best}"
        )
        run.say("context", answer)
        numbers: dict[str, object] = {"max_loaded": best, "gave_out_at": gave_out, "tried": tried}
        return Step("context", STEP_QUESTIONS["context"], answer, gave_out is not None, numbers)


async def context_step(run: EngineRun, ctx: int) -> bool:
    """Restart at `ctx` and generate once; False when memory (or the engine) gave out."""
    if await run.launch(ctx, "context") is None:
        run.say("context", f"{ctx}: the engine did not start")
        return False
    try:
        loaded = await run.settle()
        with run.phase("context", note=f"context {ctx}"):
            row = await run.load_row(LoadStep("context", 1, run.opts.prompt_tokens, 1, ctx))
        row.loaded_memory_bytes = loaded
        row.load_seconds = run.current.load_seconds if run.current else None
        row.kv_bytes = run.kv_bytes()
        res = run.result
        headroom = None
        if res.gpu_total_bytes and row.memory_bytes and run.monitor.source == "gpu":
            headroom = res.gpu_total_bytes - row.memory_bytes
        near_full = headroom is not None and headroom < threshold_number("gpu_headroom_min_bytes")
        run.say(
            "context",
            f"{ctx}: loaded, {gib(loaded)} after load, KV {gib(row.kv_bytes)}"
            + (", the card is near full" if near_full else "")
            + context_prefill_text(run, row),
        )
        if near_full:
            row.error = f"GPU memory near full at context {ctx} ({gib(headroom)} free)"
        return row.error is None
    except TargetUnreachable as exc:
        # The engine died after becoming ready (e.g. out of memory at this context).
        run.result.rows.append(
            Row(run.engine.name, "context", 1, context=ctx, parallel=run.parallel, error=str(exc))
        )
        return False
    except StepStopped as exc:
        if exc.interrupted:
            raise
        # The engine died during the request (its row says so): memory gave out here.
        return False
    finally:
        run.stop()


def context_prefill_text(run: EngineRun, row: Row) -> str:
    """`; prompt P s at N tok/s = E % of the compute limit` at this context, or ''."""
    if row.prefill_tok_s is None or row.prefill_s is None:
        return ""
    text = f"; prompt {row.prefill_s:.3f} s at {row.prefill_tok_s:.0f} tok/s"
    p = row_prefill(run.result, row)
    if p.efficiency is not None and not p.misfit:
        text += f" = {p.efficiency * 100:.0f} % of the card's compute limit"
    return text
