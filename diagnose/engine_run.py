"""One engine under measurement: the state of its run, and (re)launching it.

`EngineRun` holds the engine's configuration, the options, the monitor, what the run has
gathered so far (the engine's `Facts` as a value, the rows as measured, the notes, the
evidence and what could not be measured), the answers so far and the verdicts of the load
steps; plus launching, stopping and settling the engine when it has a launch template. The
procedure builds the result from what it gathered once, at the end
(`diagnose.decision.built`). The steps (`diagnose.steps`) never see it:
`diagnose.step_inputs` reads each step's inputs off it and binds its seams.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path
from typing import Any

from config.settings import EngineConfig
from core import series as llmb
from core.rules import RuleValues
from core.signals import Signals
from core.slo import Slo
from diagnose.decision.model import EngineResult, Facts, PhaseMark, Row, Step
from diagnose.launcher import (
    EngineProcess,
    LaunchError,
    engine_process,
    launch_values,
    template_fields,
)
from diagnose.monitor import Monitor
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher, say
from diagnose.steps.base import LoadStep
from loadgen.scheduler.context import RunContext
from loadgen.target import Target


class EngineRun(ABC):
    """The state of one engine's measurement, read by `diagnose.step_inputs` for the steps.

    The steps' seams measure through its methods (`load_row`, `find_max`, `gpu_facts`,
    `residency_values` besides launching and the helpers); the procedure
    (`diagnose.procedure.Diagnoser`) supplies the measuring ones from `diagnose.load`,
    `diagnose.facts` and `diagnose.evidence`.
    """

    def __init__(
        self,
        engine: EngineConfig,
        opts: Options,
        out: Path,
        publisher: PhasePublisher,
        ctx: RunContext | None = None,
    ):
        self.engine = engine
        self.opts = opts
        self.out = out
        self.pub = publisher
        # One RunContext per run: compare shares it, so both engines get the same prompts.
        self.ctx = ctx or RunContext(out)
        self.monitor = Monitor(engine.name, opts)
        # What the run gathers, for its result (built at the end): the engine's facts (a
        # value, replaced as it is read again), the rows as measured (a stop keeps them,
        # --find-max reads them), what could not be measured, notes and evidence.
        self.facts = Facts(name=engine.name, kind=engine.kind, url=engine.url)
        self.rows: list[Row] = []
        self.missing: list[str] = []
        self.notes: list[str] = []
        self.evidence: dict[str, str] = {}
        self.current: EngineProcess | None = None
        self.steps: dict[str, Step] = {}
        # (step, verdict, signals) of the decision core at the end of each load step.
        self.step_verdicts: list[tuple[str, str, Signals]] = []
        self.round_no = 0
        self.model_path: Path | None = engine.model_path
        self.launched_ctx: int | None = None
        self.loaded_memory: float | None = None
        self.parallel: int | None = None

    # measuring (supplied by the procedure) ---------------------------------------------

    @abstractmethod
    async def load_row(self, load: LoadStep) -> Row:
        """One load step through the scheduler, `load.rounds` times, as a row of the result."""

    @abstractmethod
    async def find_max(self, slo: Slo) -> str:
        """--find-max: bisect between the measured levels for the highest load within `slo`."""

    @abstractmethod
    async def gpu_facts(self) -> Facts:
        """The facts with the card, memory, layers and buffers read again from the
        exporter's series."""

    @abstractmethod
    def view(self) -> EngineResult:
        """The result as far as the run has gathered it, for the readers of a result mid-run."""

    @abstractmethod
    def residency_values(self) -> RuleValues:
        """The rules' values of the engine at rest, from diagnose's own readings."""

    # helpers ----------------------------------------------------------------------------

    def phase(self, name: str, note: str = "") -> contextlib.AbstractContextManager[PhaseMark]:
        """Mark the phase `name` of this engine for the duration of the block."""
        return self.pub.mark(self.engine.name, name, note)

    def say(self, step: str, text: str) -> None:
        """One progress line of this engine's `step`."""
        say(f"[{self.engine.name}] {step}: {text}")

    def note(self, text: str) -> None:
        """A note of the result, once."""
        if text not in self.notes:
            self.notes.append(text)

    def target(self) -> Target:
        """The engine as the load generator's target (the running launch's URL)."""
        url = self.engine.url
        if self.current is not None:
            url = self.current.health_url.removesuffix("/health")
        return Target(
            self.engine.name, url, self.engine.kind, self.engine.api_key(), self.opts.model
        )

    def template(self) -> set[str]:
        """The placeholders of the launch template (none without one)."""
        launch = self.engine.launch
        return template_fields(launch.command) if launch is not None else set()

    # launching --------------------------------------------------------------------------

    async def launch(self, ctx: int | None, phase: str) -> EngineProcess | None:
        """Start the engine at context `ctx` (None: the template's); None when it failed."""
        parallel = self.parallel
        log_path = (
            self.out / f"{self.engine.name}-c{ctx or 'default'}-np{parallel or 'default'}.log"
        )
        overrides: dict[str, Any] = {"parallel": parallel}
        if ctx:
            overrides["ctx"] = ctx
        try:
            proc = engine_process(self.engine, overrides, log_path)
        except (LaunchError, KeyError) as exc:
            self.failed_launch(ctx, str(exc))
            return None
        self.monitor.process = proc
        with contextlib.suppress(KeyError, TypeError, ValueError):
            self.launched_ctx = int(launch_values(self.engine, overrides, log_path)["ctx"])
        self.say(phase, f"starting the engine ({' '.join(shlex.quote(a) for a in proc.argv)})")
        with self.phase(phase, note=" ".join(proc.argv)) as ph:
            try:
                # The health wait blocks; keep the event loop (and the sampler) free.
                load = await asyncio.to_thread(proc.start)
            except LaunchError as exc:
                ph.note = f"failed: {exc}"
                self.monitor.process = None
                self.failed_launch(ctx, str(exc))
                return None
            ph.memory_bytes = await self.monitor.memory_now()
            ph.note = f"load {load:.2f} s: " + ph.note
        self.current = proc
        engine_log = proc.engine_log if "log" in self.template() else self.engine.log_file
        await self.monitor.attach(self.engine, engine_log, proc.pid)
        if self.facts.load_seconds is None:
            self.facts = replace(self.facts, load_seconds=load)
        return proc

    def failed_launch(self, ctx: int | None, error: str) -> None:
        """A context row for a launch that failed."""
        self.rows.append(
            Row(
                self.engine.name,
                "context",
                1,
                context=ctx,
                parallel=self.parallel,
                error=error.splitlines()[0],
            )
        )

    def stop(self) -> None:
        """Stop the launched engine (if any)."""
        if self.current is not None:
            self.current.stop()
        self.current = None
        self.monitor.process = None

    async def settle(self) -> float | None:
        """Wait the settle time after a launch; the memory then."""
        seconds = self.opts.settle
        if seconds is None:
            seconds = self.engine.launch.settle_seconds if self.engine.launch else 0.0
        with self.phase("settle") as ph:
            await asyncio.sleep(seconds)
            ph.memory_bytes = await self.monitor.memory_now()
            ph.note = "loaded memory after settling"
        return ph.memory_bytes

    def kv_bytes(self) -> float | None:
        """KV cache bytes of the running launch (the exporter's, read from the engine's log)."""
        return self.monitor.engine_value(llmb.ENGINE_KV_CACHE_BYTES)
