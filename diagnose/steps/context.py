"""Long context: restart with only the context changed; where does memory give out?"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from core.thresholds import threshold_number
from diagnose.decision.model import Prefill, Row, Step
from diagnose.steps.base import (
    LoadStep,
    MeasureLoad,
    Say,
    StepOutcome,
    StepStopped,
    asked,
    gib,
    not_measured,
)
from loadgen.client import TargetUnreachable


@dataclass(frozen=True)
class ContextInputs:
    """What the context sweep reads: the launch template, the options' contexts, the model's
    and the first launch's contexts, and the card's memory."""

    engine: str
    launchable: bool  # the engine has a launch template (else it was already running)
    has_ctx: bool  # the template has a {ctx} placeholder
    contexts: tuple[int, ...] | None  # --contexts (None: doubling up to the top)
    max_context: int | None
    trained_context: int | None
    slot_context: int | None
    launched_ctx: int | None  # the first launch's context, when known
    prompt_tokens: int
    parallel: int | None
    gpu_total_bytes: float | None


@dataclass(frozen=True)
class LaunchFigures:
    """The first launch as measured before the sweep: its single row, memory after load,
    load time and KV bytes (the sweep's first row at the first --contexts value)."""

    single: Row | None = None
    loaded_memory: float | None = None
    load_seconds: float | None = None
    kv_bytes: float | None = None


class Restarts(Protocol):
    """The engine's (re)launches as the sweep drives them."""

    async def launch(self, ctx: int) -> bool:
        """Start the engine at `ctx`; False when it did not start (its row is recorded)."""

    async def settle(self) -> float | None:
        """Wait the settle time; the memory then."""

    def stop(self) -> None:
        """Stop the launched engine (if any)."""

    def load_seconds(self) -> float | None:
        """The running launch's load time."""

    def kv_bytes(self) -> float | None:
        """The running launch's KV cache bytes."""

    def memory_is_gpu(self) -> bool:
        """Whether the memory figures are the GPU's (not host memory)."""


@dataclass(frozen=True)
class ContextSeams:
    """How the sweep measures: the restarts, a load step, a row's prompt figures."""

    restarts: Restarts
    measure: MeasureLoad
    prefill: Callable[[Row], Prefill]
    say: Say


def contexts(inputs: ContextInputs) -> tuple[list[int], str]:
    """The contexts to restart at, or [] and why not."""
    if not inputs.launchable:
        return [], "the engine was already running (no launch template to restart it)"
    if not inputs.has_ctx:
        return [], "the launch template has no {ctx} placeholder"
    if inputs.contexts is not None:
        given = list(inputs.contexts[1:]) if inputs.contexts else []
        return given, "" if given else "no further --contexts given"
    top = inputs.max_context or inputs.trained_context
    if not top:
        return [], "the model's trained context is unknown (pass --contexts or --max-context)"
    start = inputs.launched_ctx or inputs.slot_context or 4096
    out = []
    ctx = start * 2
    while ctx < top:
        out.append(ctx)
        ctx *= 2
    out.append(top)
    out = [c for c in out if c > start]
    why = "" if out else f"the launch context {start} already reaches the top ({top})"
    return out, why


def launch_context_row(inputs: ContextInputs, first: LaunchFigures) -> Row | None:
    """The launch at the first --contexts value counts as the sweep's first row."""
    if not (inputs.contexts and inputs.has_ctx) or first.single is None:
        return None
    return replace(first.single, step="context", context=inputs.contexts[0],
                   aggregate_rounds=[], ttft_rounds=[], per_seq_rounds=[],
                   loaded_memory_bytes=first.loaded_memory, load_seconds=first.load_seconds,
                   kv_bytes=first.kv_bytes)  # fmt: skip


@dataclass
class _Sweep:
    """The sweep's rows so far: the first launch's, the measured ones it completed (by their
    index in the result) and the ones it made for a launch that died."""

    leading: tuple[Row, ...]
    amended: list[tuple[int, Row]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def outcome(self, step: Step, stopped: StepStopped | None = None) -> StepOutcome:
        return StepOutcome(
            step, tuple(self.rows), tuple(self.amended), leading=self.leading, stopped=stopped
        )

    def loaded(self) -> list[int]:
        """The contexts that loaded (rows without an error)."""
        rows = (*self.leading, *(r for _, r in self.amended), *self.rows)
        return [r.context for r in rows if r.context and r.error is None]


async def context_outcome(
    seams: ContextSeams, inputs: ContextInputs, first: LaunchFigures
) -> StepOutcome:
    """The first launch's row, then a restart per context until one gives out; flagged when
    memory (or the engine) gave out."""
    launch_row = launch_context_row(inputs, first)
    sweep = _Sweep((launch_row,) if launch_row else ())
    seams.restarts.stop()
    tried, why = contexts(inputs)
    if not tried and launch_row is None:
        return not_measured("context", why, seams.say)
    gave_out: int | None = None
    try:
        for ctx in tried:
            if not await context_step(seams, inputs, sweep, ctx):
                gave_out = ctx
                break
    except StepStopped as exc:  # interrupted: what the sweep has is kept
        return sweep.outcome(asked("context", ""), exc)
    loaded = sweep.loaded()
    best = max(loaded) if loaded else None
    answer = (
        f"memory gives out at {gave_out} tokens (largest context loaded: {best})"
        if gave_out
        else f"every context loaded up to {best}"
    )
    seams.say(answer)
    numbers: dict[str, object] = {"max_loaded": best, "gave_out_at": gave_out, "tried": tried}
    step = asked("context", answer, gave_out is not None, numbers)
    return sweep.outcome(step)


async def context_step(seams: ContextSeams, inputs: ContextInputs, sweep: _Sweep, ctx: int) -> bool:
    """Restart at `ctx` and generate once; False when memory (or the engine) gave out."""
    restarts = seams.restarts
    if not await restarts.launch(ctx):
        seams.say(f"{ctx}: the engine did not start")
        return False
    try:
        loaded = await restarts.settle()
        load = LoadStep("context", 1, inputs.prompt_tokens, 1, ctx)
        measured = await seams.measure(load, note=f"context {ctx}")
        row = replace(
            measured.row,
            loaded_memory_bytes=loaded,
            load_seconds=restarts.load_seconds(),
            kv_bytes=restarts.kv_bytes(),
        )
        headroom = None
        if inputs.gpu_total_bytes and row.memory_bytes and restarts.memory_is_gpu():
            headroom = inputs.gpu_total_bytes - row.memory_bytes
        near_full = headroom is not None and headroom < threshold_number("gpu_headroom_min_bytes")
        seams.say(
            f"{ctx}: loaded, {gib(loaded)} after load, KV {gib(row.kv_bytes)}"
            + (", the card is near full" if near_full else "")
            + context_prefill_text(seams.prefill(row), row)
        )
        if near_full:
            row = replace(
                row, error=f"GPU memory near full at context {ctx} ({gib(headroom)} free)"
            )
        sweep.amended.append((measured.index, row))
        return row.error is None
    except TargetUnreachable as exc:
        # The engine died after becoming ready (e.g. out of memory at this context).
        sweep.rows.append(
            Row(inputs.engine, "context", 1, context=ctx, parallel=inputs.parallel, error=str(exc))
        )
        return False
    except StepStopped as exc:
        if exc.interrupted:
            raise
        # The engine died during the request (its row says so): memory gave out here.
        return False
    finally:
        restarts.stop()


def context_prefill_text(p: Prefill, row: Row) -> str:
    """`; prompt P s at N tok/s = E % of the compute limit` at this context (`p`: the row's
    prompts against the card), or ''."""
    if row.prefill_tok_s is None or row.prefill_s is None:
        return ""
    text = f"; prompt {row.prefill_s:.3f} s at {row.prefill_tok_s:.0f} tok/s"
    if p.efficiency is not None and not p.misfit:
        text += f" = {p.efficiency * 100:.0f} % of the card's compute limit"
    return text
