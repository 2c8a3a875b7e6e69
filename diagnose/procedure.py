"""`llmb-loadgen diagnose`: the seed's whole measuring procedure for one engine.

Steps, in order (`diagnose.step_inputs.PROCEDURE`, one module each in `diagnose.steps`):
residency (are all weights on the GPU), single-request decode against the card's roofline,
concurrency, a KV-pressure step (long prompts that fill the slots) and a context sweep
(restarts with only the context changed, up to the model's trained context or until memory
gives out); each step's outcome is taken in one place (`Diagnoser.apply`), and the result is
built once, at the end, from the facts, the rows and the outcomes (`Diagnoser.result`).
Load goes through the load generator's scheduler (`diagnose.load`), the exporter's series
through the monitor (`diagnose.monitor`) and the verdict through the decision core `core`:
the samples are turned into the recording rules' signals exactly as Prometheus would. A step
that cannot run says `not measured: <why>`.

`llmb-loadgen compare --engine A --engine B` (`compare`): the same requests against two
engines. The engines are measured one after the other (on one GPU they cannot both hold their
weights), each through the whole `diagnose` procedure, with the same prompt text
(calibrated once, on the first engine), the same max tokens, temperature 0 and ignore_eos,
the same concurrencies and `--rounds` rounds of every load step. Then, in the seed's order:
residency, comparability (weight bytes per parameter within 20 %, else the per-roofline
comparison and a labelled estimate at the other's precision), single-request decode,
batching at every measured concurrency (aggregate tok/s and TTFT at equal load), and where
each engine's memory gives out. A difference is called only when its bootstrap interval
(rounds, waves and requests) clears what the run can resolve (`core.stats.resolvable`). A is
the engine in use; the recommendation is `stay` (no difference beyond the noise),
`stay_and_tune`, `switch_to:B`, `fix_memory_first` or `inconclusive`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from config.settings import EngineConfig
from core.conditions import VERDICTS
from core.roofline import MISFIT_BY_NAME, misfit_text
from core.rules import RuleValues
from core.signals import SIGNAL_FIELDS, Signals
from core.slo import Slo
from diagnose.decision.built import engine_result
from diagnose.decision.model import NOT_MEASURED, Decision, EngineResult, Facts, Row, Step
from diagnose.decision.one_engine import decide_single, engine_verdict
from diagnose.decision.requests import load_requests
from diagnose.decision.slo import with_slo
from diagnose.decision.two_engines import CompareInputs, decide_compare
from diagnose.engine_run import EngineRun
from diagnose.evidence import card_evidence, residency_values
from diagnose.facts import (
    collect_facts,
    gpu_facts,
    record_evidence,
    structure_facts,
    with_collected,
)
from diagnose.find_max import find_max
from diagnose.load import measure_row
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.step_inputs import PROCEDURE
from diagnose.step_table import STEPS
from diagnose.steps.base import LoadStep, StepOutcome, StepStopped, asked, not_measured
from loadgen.client import TargetUnreachable
from loadgen.scheduler.context import RunContext
from loadgen.scheduler.phase import ABORT_ENGINE_GONE, ABORT_INTERRUPTED
from loadgen.session import stopping_on_signals
from loadgen.traffic.summary import traffic_mix

__all__ = ["PROCEDURE", "Diagnoser", "combine", "compare", "diagnose"]

# --traffic: the steps whose load is fixed lengths of the tool's choosing, not the user's
# traffic, are skipped with these reasons (docs/diagnose.md, "Your traffic"): the verdict is
# the traffic's alone. The concurrency step replays the traffic instead.
TRAFFIC_SKIPS = {
    "single": "skipped under --traffic: one request at a time of --prompt-tokens is not your "
    "traffic (run diagnose without --traffic for the single-request roofline)",
    "kv_pressure": "skipped under --traffic: its probe prompts (half a slot each) are not your "
    "traffic; your traffic's KV usage is in the concurrency step",
    "context": "skipped under --traffic: the context sweep restarts the engine at fixed "
    "lengths; your traffic ran at the launch context",
}


@dataclass(frozen=True)
class Stop:
    """Why the procedure ended before its last step: at `step`, for `reason`; `interrupted`:
    Ctrl-C (or SIGTERM), not the engine."""

    step: str
    reason: str
    interrupted: bool


class Diagnoser(EngineRun):
    """Runs the steps for one engine; its EngineResult, with the verdict, is built at the end."""

    stopped: Stop | None = None

    async def measure_all(self) -> EngineResult:
        """Measure everything this engine's configuration allows, then decide."""
        self.facts = replace(self.facts, launched=self.engine.launch is not None)
        self.monitor.start()
        try:
            await self._run()
        finally:
            self.stop()
            await self.monitor.stop()
        return self.result()

    # the measuring methods the steps' seams call (EngineRun's) -------------------------

    async def load_row(self, load: LoadStep) -> Row:
        return await measure_row(self, load)

    async def find_max(self, slo: Slo) -> str:
        return await find_max(self, slo)

    async def gpu_facts(self) -> Facts:
        return await gpu_facts(self)

    def residency_values(self) -> RuleValues:
        return residency_values(self)

    def view(self) -> EngineResult:
        """The result so far: the facts, the rows and what follows from them, what could not
        be measured, the notes and the evidence."""
        return engine_result(
            self.facts,
            self.rows,
            missing=list(self.missing),
            notes=list(self.notes),
            evidence=dict(self.evidence),
        )

    async def _run(self) -> None:
        if "parallel" in self.template():
            self.parallel = self.opts.parallel or max(self.opts.concurrency)
        if self.engine.launch is not None:
            if not await self._start():
                return
        else:
            self.missing.append(
                "baseline memory and load time: the engine was already running (no launch template)"
            )
            await self.monitor.attach(self.engine, self.engine.log_file, None)
        await self.read_facts()
        for key in PROCEDURE:
            try:
                if self.ctx.stop.is_set():
                    raise StepStopped(f"{ABORT_INTERRUPTED}: stopped by a signal", True)
                if self.opts.traffic is not None and key in TRAFFIC_SKIPS:
                    self.skip(key, TRAFFIC_SKIPS[key])
                    continue
                await self.measure_step(key)
            except StepStopped as exc:
                self._stopped(key, exc)
                return
            except TargetUnreachable as exc:  # the engine went away between two steps
                self._stopped(key, StepStopped(f"{ABORT_ENGINE_GONE}: {exc}", False))
                return

    async def read_facts(self) -> None:
        """What is known before any load (`collect_facts`), then the exporter's series
        (`gpu_facts`): the run's facts."""
        facts = await collect_facts(self.engine, self.opts, self.target(), self.model_path)
        self.model_path = facts.model_path
        self.facts = with_collected(self.facts, facts)
        self.evidence["model"] = facts.model_evidence
        self.facts = await gpu_facts(self)

    async def measure_step(self, key: str) -> None:
        """Run the step `key` on the inputs handed down to it and apply its outcome; a step
        that ended early (its outcome's `stopped`) raises once what it has is applied."""
        start = len(self.rows)
        outcome = await PROCEDURE[key](self)
        self.apply(outcome, start)
        if outcome.stopped is not None:
            raise outcome.stopped

    def skip(self, key: str, why: str) -> None:
        """The step `key` does not run: its answer says why, recorded as missing."""
        self.apply(not_measured(key, why, partial(self.say, key)), len(self.rows))

    def apply(self, outcome: StepOutcome, start: int) -> None:
        """A step's outcome taken in, the one place a step's answer lands: the rows it
        completed and made (`start`: where its rows begin), what it could not measure and
        its answer."""
        for index, row in outcome.amended:
            self.rows[index] = row
        self.rows[start:start] = outcome.leading
        self.rows.extend(outcome.rows)
        self.missing.extend(outcome.missing)
        self.steps[outcome.step.key] = outcome.step

    def _stopped(self, key: str, exc: StepStopped) -> None:
        """The procedure ends at step `key`: it and the later steps say why, nothing more runs."""
        self.stopped = Stop(key, exc.reason, exc.interrupted)
        self.say(key, f"stopped: {exc.reason}")
        why = f"the run stopped during the {key} step ({exc.reason})"
        for later in STEPS[STEPS.index(key) :]:
            self.steps[later] = asked(later, NOT_MEASURED + why)
        self.missing.append(f"{', '.join(STEPS[STEPS.index(key) :])}: {why}")

    async def _start(self) -> bool:
        """Baseline memory, the first launch and its settling; False when it did not start."""
        with self.phase("baseline") as ph:
            ph.memory_bytes = await self.monitor.memory_now()
        first_ctx = self.opts.contexts[0] if self.opts.contexts else None
        if await self.launch(first_ctx, "start") is None:
            for key in STEPS[:-1]:
                self.skip(key, "the engine did not start (see the context row)")
            self.steps["context"] = asked(
                "context",
                "memory gave out (or the engine failed) at the first launch: "
                f"{self.rows[-1].error}",
                True,
            )
            return False
        self.loaded_memory = await self.settle()
        return True

    def result(self) -> EngineResult:
        """The engine's result, built once from what the run gathered: its facts (with the
        newest structure series and the memory's source), the rows, what could not be
        measured, the notes and evidence, the phases and memory timeline, and the decision
        core's verdict over the load steps."""
        self.facts = replace(
            structure_facts(self), memory_source=self.facts.memory_source or self.monitor.source
        )
        if self.facts.memory_source is None:
            self.missing.append("memory: no exporter, no NVML and the engine was not launched")
        if self.facts.bandwidth_bytes_per_s is None:
            self.missing.append("roofline: no GPU bandwidth known (pass --bandwidth-gbs)")
        if self.opts.exporter_url and not self.monitor.scrapes:
            self.missing.append(f"exporter: no scrape of {self.opts.exporter_url} succeeded")
        record_evidence(self)
        measured = self.view()
        roof = measured.roofline
        if roof.misfit is not None and roof.efficiency is not None:
            self.note("roofline: " + misfit_text(roof.efficiency, MISFIT_BY_NAME[roof.misfit]))
        verdict, signals = combine(self.step_verdicts)
        decided, action, signal_values = None, "", {}
        if verdict is not None:
            decided, action = engine_verdict(measured, signals)
            signal_values = {k: getattr(signals, k) for k in SIGNAL_FIELDS}
            card = card_evidence(self, signals)
            if card is not None:
                self.evidence["card"] = card
        opts, stop = self.opts, self.stopped
        return replace(
            measured,
            notes=list(self.notes),
            evidence=dict(self.evidence),
            phases=[p for e, p in self.pub.phases if e == self.engine.name],
            timeline=list(self.monitor.timeline),
            stopped=f"{stop.step}: {stop.reason}" if stop is not None else None,
            interrupted=stop is not None and stop.interrupted,
            traffic=(
                traffic_mix(opts.traffic, opts.time_scale, opts.schedule, opts.traffic_width())
                if opts.traffic is not None
                else None
            ),
            verdict=decided,
            action=action,
            signals=signal_values,
        )

    def answer_steps(self) -> list[Step]:
        """The steps in procedure order (one per step, measured or not)."""
        return [self.steps.get(s) or asked(s, NOT_MEASURED + "did not run") for s in STEPS]


# Verdicts about the load's prompts, which the KV-pressure step's long probe prompts do not show.
PROBE_PROMPT_VERDICTS = ("ttft_waiting_bound", "prefill_at_card_limit", "prefill_below_card_limit")


def combine(step_verdicts: list[tuple[str, str, Signals]]) -> tuple[str | None, Signals]:
    """The run's verdict: the first in the decision order that any load step showed.

    Each step's verdict is what the rules give at its end; a bottleneck seen in one step
    (a queue at high concurrency, KV pressure under long prompts) is the answer even when
    another step did not show it. `idle` counts only when no step showed anything else.
    The KV-pressure step's prompts are the tool's own probe (as long as half a slot), not the
    load's: its prompt verdicts (`PROBE_PROMPT_VERDICTS`) do not count.
    """
    if not step_verdicts:
        return None, Signals()
    for name in VERDICTS:
        if name == "idle":
            continue
        for step, verdict, sig in step_verdicts:
            if verdict == name and not (step == "kv_pressure" and name in PROBE_PROMPT_VERDICTS):
                return name, sig
    return "idle", step_verdicts[-1][2]


async def diagnose(
    engine: EngineConfig, opts: Options, out: Path, pub: PhasePublisher | None = None
) -> tuple[EngineResult, Decision]:
    """Run every step for one engine; return what was measured and the answer."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    ctx = RunContext(out)
    try:
        d = Diagnoser(engine, opts, out, pub or PhasePublisher(), ctx)
        with stopping_on_signals(ctx.stop):  # Ctrl-C: the finished steps are kept
            result = await d.measure_all()
    finally:
        ctx.close()
    decision = decide_single(result, d.answer_steps())
    if opts.slo is not None:
        reqs = await asyncio.to_thread(load_requests, out, [result])
        decision = with_slo(decision, result, reqs, opts.slo)
    return result, decision


def not_run(engine: EngineConfig, why: str) -> EngineResult:
    """The result of an engine the run never reached (Ctrl-C during the other one)."""
    return EngineResult(
        name=engine.name,
        kind=engine.kind,
        url=engine.url,
        missing=[f"every step: {why}"],
        stopped=f"not run: {why}",
        interrupted=True,
    )


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
        results: list[EngineResult] = []
        with stopping_on_signals(ctx.stop):  # Ctrl-C: the finished steps are kept
            for engine in engines:
                if ctx.stop.is_set():
                    results.append(not_run(engine, "the run was interrupted before it"))
                    continue
                results.append(await Diagnoser(engine, opts, out, pub, ctx).measure_all())
    finally:
        ctx.close()
    ra, rb = results
    # The requests just written: the same reader `llmb-loadgen decide` uses on a saved run.
    reqs = await asyncio.to_thread(load_requests, out, results)
    return results, decide_compare(
        ra, rb, CompareInputs(reqs, opts.load, opts.slo, opts.load_source)
    )
