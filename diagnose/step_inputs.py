"""What each step of the procedure is handed, read from the engine run, in the order they run.

`PROCEDURE` maps each step's key to the function that reads its inputs (options, facts) off
the `EngineRun`, binds its measuring seams (a load step in its phase, --find-max, the
restarts) and calls the step; the step returns its `StepOutcome`, which the procedure
(`diagnose.procedure.Diagnoser.apply`) takes in; the result is built from it at the end.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial

from core.slo import Slo
from diagnose.decision.model import single_row
from diagnose.decision.prefill import row_prefill
from diagnose.decision.roofline import row_roofline_text
from diagnose.engine_run import EngineRun
from diagnose.step_table import STEPS
from diagnose.steps.base import LoadStep, Measured, MeasureLoad, Say, StepOutcome
from diagnose.steps.concurrency import (
    ConcurrencyInputs,
    ConcurrencySeams,
    Probed,
    concurrency_outcome,
)
from diagnose.steps.context import ContextInputs, ContextSeams, LaunchFigures, context_outcome
from diagnose.steps.kv import KvInputs, kv_outcome
from diagnose.steps.residency import residency_outcome
from diagnose.steps.single import SingleFigures, single_outcome


def _say(run: EngineRun, key: str) -> Say:
    return partial(run.say, key)


def _verdicts_since(run: EngineRun, before: int, key: str) -> tuple[str, ...]:
    """The rules' verdicts for step `key` recorded after the first `before` ones."""
    return tuple(v for s, v, _ in run.step_verdicts[before:] if s == key)


def load_seam(run: EngineRun) -> MeasureLoad:
    """One load step in its phase through the run's `load_row` (which records its row and
    the rules' verdict at its end): the row, where it is recorded, and the verdicts."""

    async def measure(load: LoadStep, note: str = "") -> Measured:
        before = len(run.step_verdicts)
        with run.phase(load.key, note=note):
            row = await run.load_row(load)
        rows = run.rows
        index = next(i for i in range(len(rows) - 1, -1, -1) if rows[i] is row)
        return Measured(row, index, _verdicts_since(run, before, load.key))

    return measure


def find_max_seam(run: EngineRun) -> Callable[[Slo], Awaitable[Probed]]:
    """--find-max through the run: its line and the verdicts of its probes."""

    async def find_max(slo: Slo) -> Probed:
        before = len(run.step_verdicts)
        text = await run.find_max(slo)
        return Probed(text, _verdicts_since(run, before, "concurrency"))

    return find_max


async def residency(run: EngineRun) -> StepOutcome:
    """The facts re-read at rest (in the residency phase) and the rules' signals then."""
    with run.phase("residency") as ph:
        run.facts = await run.gpu_facts()
        ph.memory_bytes = run.facts.process_gpu_bytes
    values = run.monitor.rule_values(time.time())
    if values is None:  # no exporter sample: the samples it would have given
        values = run.residency_values()
    return residency_outcome(run.facts, values.signals, _say(run, "residency"))


async def single(run: EngineRun) -> StepOutcome:
    """The single step: its load's lengths, the roofline and prompt figures after it."""

    def figures() -> SingleFigures:
        so_far = run.view()
        return SingleFigures(so_far.roofline, so_far.prefill)

    opts = run.opts
    say = _say(run, "single")
    return await single_outcome(load_seam(run), figures, opts.prompt_tokens, opts.rounds, say)


async def concurrency(run: EngineRun) -> StepOutcome:
    """The concurrency step: the levels or the traffic, the slots, the single row, the SLO."""
    opts, known = run.opts, run.facts
    seams = ConcurrencySeams(
        load_seam(run),
        find_max_seam(run),
        # The facts as of the row's end (its load may bring series such as the accept length).
        lambda row: row_roofline_text(run.facts, row),
        _say(run, "concurrency"),
    )
    inputs = ConcurrencyInputs(
        tuple(opts.concurrency),
        opts.prompt_tokens,
        opts.rounds,
        slots=known.slots,
        single=single_row(run.rows),
        find_max_slo=opts.slo if opts.find_max else None,
        traffic=opts.traffic,
        traffic_width=opts.traffic_width(),
    )
    return await concurrency_outcome(seams, inputs)


async def kv_pressure(run: EngineRun) -> StepOutcome:
    """The KV step: the options' lengths and concurrencies, the slots and their context."""
    opts, known = run.opts, run.facts
    inputs = KvInputs(
        opts.kv_prompt_tokens, opts.max_tokens, tuple(opts.concurrency), known.slots,
        known.slot_context,
    )  # fmt: skip
    return await kv_outcome(load_seam(run), inputs, _say(run, "kv_pressure"))


class RunRestarts:
    """The engine's restarts at a context, as the context sweep drives them."""

    def __init__(self, run: EngineRun):
        self.run = run

    async def launch(self, ctx: int) -> bool:
        return await self.run.launch(ctx, "context") is not None

    async def settle(self) -> float | None:
        return await self.run.settle()

    def stop(self) -> None:
        self.run.stop()

    def load_seconds(self) -> float | None:
        return self.run.current.load_seconds if self.run.current else None

    def kv_bytes(self) -> float | None:
        return self.run.kv_bytes()

    def memory_is_gpu(self) -> bool:
        return self.run.monitor.source == "gpu"


def context_inputs(run: EngineRun) -> ContextInputs:
    """The sweep's inputs: the template, the options' contexts, the contexts known so far."""
    opts, known = run.opts, run.facts
    return ContextInputs(
        engine=run.engine.name,
        launchable=run.engine.launch is not None,
        has_ctx="ctx" in run.template(),
        contexts=tuple(opts.contexts) if opts.contexts is not None else None,
        max_context=opts.max_context,
        trained_context=known.trained_context,
        slot_context=known.slot_context,
        launched_ctx=run.launched_ctx,
        prompt_tokens=opts.prompt_tokens,
        parallel=run.parallel,
        gpu_total_bytes=known.gpu_total_bytes,
    )


async def context(run: EngineRun) -> StepOutcome:
    """The context sweep: its inputs, the restarts and the first launch's figures."""
    restarts = RunRestarts(run)
    seams = ContextSeams(
        restarts,
        load_seam(run),
        lambda row: row_prefill(run.facts, row),
        _say(run, "context"),
    )
    first = LaunchFigures(
        single_row(run.rows),
        run.loaded_memory,
        restarts.load_seconds(),
        run.kv_bytes(),
    )
    return await context_outcome(seams, context_inputs(run), first)


# The steps, registered explicitly in the order they run (the context sweep restarts).
PROCEDURE: dict[str, Callable[[EngineRun], Awaitable[StepOutcome]]] = {
    "residency": residency,
    "single": single,
    "concurrency": concurrency,
    "kv_pressure": kv_pressure,
    "context": context,
}
assert tuple(PROCEDURE) == STEPS
