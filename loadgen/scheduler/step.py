"""One step: every target in turn (same prompts, same order), then the token verification."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from loadgen.client import StreamClient
from loadgen.metrics import StepStart
from loadgen.results import RequestRecord, step_reasons
from loadgen.scheduler.calibration import calibrate_within
from loadgen.scheduler.context import Prompts, RunContext
from loadgen.scheduler.phase import ABORT_INTERRUPTED, EnginePhase
from loadgen.scheduler.spec import RunSpec
from loadgen.summary import StepResult, StepSummary, engine_summary, mark_validity

log = logging.getLogger(__name__)


@dataclass
class _Turn:
    """How one engine's turn in a step ended."""

    summary: StepSummary | None = None
    records: list[RequestRecord] = field(default_factory=list)
    interrupted: bool = False
    abort_reason: str | None = None


async def _wait_or_stop(awaitable: Awaitable[Any], stop: asyncio.Event) -> bool:
    """Run `awaitable` until done or `stop` is set (then cancel it); True when stopped."""
    task = asyncio.ensure_future(awaitable)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        task.result()
        return False
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return True


async def _warm_up(
    ctx: RunContext, spec: RunSpec, client: StreamClient, prompts: Prompts, step: int
) -> _Turn | None:
    """The warm-up requests; a turn when they ended the step (stopped or aborted)."""
    if not spec.warmup:
        return None
    warm = EnginePhase(ctx, spec, client, prompts, step, measured=False)
    log.info("%s: %d warm-up requests", client.target.name, spec.warmup)
    if await _wait_or_stop(warm.run(), ctx.stop):
        return _Turn(interrupted=True)
    if warm.abort_reason is not None:
        return _Turn(abort_reason=f"warm-up: {warm.abort_reason}")
    return None


async def _measure(
    ctx: RunContext,
    spec: RunSpec,
    client: StreamClient,
    prompts: Prompts,
    step: int,
    metrics_ptokens: int | None,
) -> _Turn:
    """The measured phase of one engine, with its probe, live metrics and summary."""
    target = client.target
    if ctx.metrics is not None:
        ptok = prompts.measured_tokens or spec.prompt_tokens
        ctx.metrics.start_step(
            StepStart(target.name, step, spec.concurrency, metrics_ptokens or ptok, spec.max_tokens)
        )
    probe = ctx.probe_factory(target) if ctx.probe_factory else None
    if probe is not None:
        await probe.start()
    await client.preopen(spec.preopen_count())
    phase = EnginePhase(ctx, spec, client, prompts, step, measured=True)
    ctx.progress.begin(f"{target.name} step {step}", phase.limit)
    t0 = time.perf_counter()
    try:
        stopped = await _wait_or_stop(phase.run(), ctx.stop)
    finally:
        ctx.progress.end()
    wall = time.perf_counter() - t0
    server = await probe.stop() if probe is not None else None
    summary = engine_summary(
        phase.records, spec, target, step=step, wall_s=wall, model=client.model, server=server
    )
    return _Turn(summary, phase.records, stopped, phase.abort_reason)


async def run_step(
    spec: RunSpec,
    ctx: RunContext,
    step: int = 0,
    metrics_ptokens: int | None = None,
) -> StepResult:
    """Run one setting on every target in turn (same prompts, same order) and verify tokens.

    Raises TargetUnreachable when a target does not answer at all.
    """
    summaries: list[StepSummary] = []
    by_engine: dict[str, list[RequestRecord]] = {}
    prompts: Prompts | None = None
    interrupted = False
    abort_reason: str | None = None
    for target in spec.targets:
        if ctx.stop.is_set():
            interrupted = True
            break
        async with StreamClient(
            target,
            pool_size=spec.pool_size(),
            endpoint=spec.endpoint,
            connect_timeout=spec.connect_timeout,
        ) as client:
            await client.open(spec.preopen_count())
            if prompts is None:
                prompts = await calibrate_within(ctx, spec, client)
            turn = await _warm_up(ctx, spec, client, prompts, step)
            if turn is None:
                turn = await _measure(ctx, spec, client, prompts, step, metrics_ptokens)
        interrupted = interrupted or turn.interrupted
        if turn.summary is not None:
            summaries.append(turn.summary)
            by_engine[target.name] = turn.records
        if turn.abort_reason is not None:
            abort_reason = turn.abort_reason
            break
        if turn.interrupted:
            break
    if interrupted and abort_reason is None:
        abort_reason = f"{ABORT_INTERRUPTED}: stopped by a signal before the step's end"
    reasons = step_reasons(by_engine, spec.max_tokens)
    if abort_reason is not None:
        reasons.append(f"aborted: {abort_reason}")
    if ctx.metrics is not None:
        for name in by_engine:
            ctx.metrics.set_mismatch(name, bool(reasons))
    mark_validity(summaries, reasons)
    return StepResult(
        step,
        spec,
        summaries,
        by_engine,
        reasons,
        interrupted,
        aborted=abort_reason is not None,
        abort_reason=abort_reason,
    )
