"""Drive a list of steps: live metrics server, Ctrl-C, pauses, reports after every step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from core.slo import Slo
from loadgen.client import TargetUnreachable
from loadgen.metrics import LoadgenMetrics
from loadgen.options import (
    DEFAULT_METRICS_HOST,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
)
from loadgen.prompts import CalibrationError
from loadgen.report import invalid_banner, to_console, write_reports
from loadgen.scheduler.context import ProbeFactory, RunContext
from loadgen.scheduler.progress import Progress
from loadgen.scheduler.spec import RunSpec
from loadgen.scheduler.step import run_step
from loadgen.summary import RunSummary, StepResult, build_summary

log = logging.getLogger(__name__)

__all__ = [
    "MetricsPortBusy",
    "SessionOptions",
    "SessionResult",
    "conclude",
    "execute",
    "exit_code",
    "run",
    "serve_metrics",
    "signals_handled",
    "stopping_on_signals",
]

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on a new event loop, uvloop's when installed (asyncio.run otherwise).

    uvloop's socket transports are C: about 25 % less CPU per streamed chunk than asyncio's
    at concurrency 64 (docs/benchmarks.md), so each read waits less for the event loop
    and the client leaves more of the machine to the server it measures.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


class MetricsPortBusy(Exception):
    """The live /metrics address cannot be bound (in use, or not an address of this host)."""


@dataclass
class SessionOptions:
    """Everything around the steps: where to write, what to serve, how long to pause."""

    out_dir: Path | None
    metrics_port: int = 0  # 0: no /metrics server
    metrics_host: str = DEFAULT_METRICS_HOST
    pause: float = 0.0
    probe_factory: ProbeFactory | None = None
    progress: bool | None = None  # None: a bar on a terminal, log lines otherwise
    run_info: dict[str, Any] = field(default_factory=dict)
    print_table: bool = True
    metrics: LoadgenMetrics | None = None  # pass one to inspect the series after the run
    slo: Slo | None = None  # --slo: the live goodput series count the requests within it


@dataclass
class SessionResult:
    """The steps that ran, the summary document and the process exit code."""

    steps: list[StepResult]
    summary: RunSummary
    exit_code: int
    error: str | None = None


async def execute(specs: list[RunSpec], options: SessionOptions) -> SessionResult:
    """Run the steps in order; the reports are rewritten after each step."""
    metrics = options.metrics or LoadgenMetrics(options.slo)
    if options.metrics_port:
        await serve_metrics(metrics, options.metrics_host, options.metrics_port)
    ctx = RunContext(
        options.out_dir,
        metrics=metrics,
        progress=Progress(options.progress),
        probe_factory=options.probe_factory,
    )
    steps: list[StepResult] = []
    error: str | None = None
    abort_reason: str | None = None
    with stopping_on_signals(ctx.stop):
        try:
            for number, spec in enumerate(specs):
                if ctx.stop.is_set():
                    break
                if number and options.pause > 0:
                    log.info("pause %.1f s before step %d", options.pause, number)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(ctx.stop.wait(), options.pause)
                    if ctx.stop.is_set():
                        break
                try:
                    result = await run_step(spec, ctx, number)
                except (TargetUnreachable, CalibrationError, RuntimeError) as exc:
                    error = str(exc)
                    abort_reason = error
                    log.error("%s", error)
                    break
                steps.append(result)
                if result.reasons:
                    log.error("step %d: %s", number, invalid_banner(result.reasons))
                if options.out_dir is not None:
                    summary = build_summary(steps, options.run_info)
                    write_reports(options.out_dir, summary.to_dict())
                if result.aborted:
                    abort_reason = f"step {number}: {result.abort_reason}"
                    break
        finally:
            ctx.close()
            await metrics.close()
    interrupted = ctx.stop.is_set()
    if interrupted and abort_reason is None:
        abort_reason = "interrupted: stopped by a signal"
    return conclude(steps, options, options.run_info, interrupted, abort_reason, error)


def conclude(
    steps: list[StepResult],
    options: SessionOptions,
    run_info: dict[str, Any],
    interrupted: bool,
    abort_reason: str | None,
    error: str | None,
) -> SessionResult:
    """The end of every run: the summary, its final reports and console table, the exit code."""
    summary = build_summary(steps, run_info, interrupted, abort_reason)
    if steps or abort_reason:
        document = summary.to_dict()
        if options.out_dir is not None:
            write_reports(options.out_dir, document)
        if options.print_table:
            print(to_console(document), flush=True)
    return SessionResult(steps, summary, exit_code(summary, error), error)


@contextlib.contextmanager
def signals_handled(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Route SIGINT and SIGTERM to `on_signal` on this event loop while the block runs."""
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            handled.append(sig)
    try:
        yield
    finally:
        for sig in handled:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)


@contextlib.contextmanager
def stopping_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set `stop` while the block runs: the load stops, finished work is kept.

    The handler is removed after the first signal, so a second Ctrl-C falls through to
    Python's default (KeyboardInterrupt) and aborts at once.
    """
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        log.warning("signal %d: stopping; finished requests are kept", signum)
        stop.set()
        with contextlib.suppress(ValueError, RuntimeError):
            loop.remove_signal_handler(signum)

    with signals_handled(on_signal):
        yield


def exit_code(summary: RunSummary, error: str | None = None) -> int:
    """The process exit code of a finished run (one rule for every way of running steps)."""
    if summary.interrupted:
        return EXIT_INTERRUPTED
    if error is not None or summary.aborted:
        return EXIT_FAILED
    if not summary.valid:
        return EXIT_INVALID
    return EXIT_OK


async def serve_metrics(metrics: LoadgenMetrics, host: str, port: int) -> None:
    """Start the live /metrics server; raises MetricsPortBusy with a one-line reason."""
    try:
        await metrics.serve(host, port)
    except OSError as exc:
        await metrics.close()
        reason = exc.strerror or str(exc)
        raise MetricsPortBusy(
            f"cannot serve metrics on {host}:{port}: {reason} "
            "(choose another --metrics-port, or 0 for none)"
        ) from None
