"""`--workers N`: one run spread over N worker processes when one process is the bottleneck.

Each worker (multiprocessing, spawn) runs a share of the load against the same targets:
closed loop, a share of the concurrency; open loop, a share of the rate (independent Poisson
streams add up to one Poisson stream of the total rate); a share of the requests, with
interleaved request indexes so no two workers send the same prompt. Workers forward every
finished request (with its inter-token gaps) to the parent, which alone writes requests.jsonl,
serves the live /metrics and computes the summary from the merged per-request records:
percentiles are recomputed over all requests, never averaged across workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

from core import series as llmb
from loadgen.metrics import LoadgenMetrics, StepStart
from loadgen.options import EXIT_FAILED, EXIT_INTERRUPTED
from loadgen.results import JsonlWriter, RequestRecord, step_reasons
from loadgen.scheduler.spec import RunSpec
from loadgen.session import (
    SessionOptions,
    SessionResult,
    conclude,
    execute,
    run,
    serve_metrics,
    signals_handled,
)
from loadgen.summary import ServerFigures, StepResult, engine_summary, mark_validity

log = logging.getLogger(__name__)

# A worker forwards its finished requests in batches: one pickle per request would make the
# queue, not the HTTP work, the cost that limits a worker.
BATCH_RECORDS = 256
BATCH_SECONDS = 0.2
# A message from a worker: (kind, worker, payload...): "start", "records" or "done".
Message = tuple[Any, ...]
# How long the parent waits for workers after they all should have stopped.
JOIN_TIMEOUT_S = 30.0


def _share(total: int, workers: int, worker: int) -> int:
    return total // workers + (1 if worker < total % workers else 0)


def _offset(spec: RunSpec, w: int) -> float:
    """Where worker w's share starts: its arrival clock (open loop) or its ramp (closed)."""
    if spec.rate is not None:
        return w / spec.rate
    return spec.ramp_up * w / max(1, spec.concurrency or 1)


def split_spec(spec: RunSpec, workers: int) -> list[RunSpec]:
    """The per-worker shares of `spec`; raises ValueError when it cannot be split that far."""
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    if spec.concurrency is not None and spec.concurrency < workers:
        raise ValueError(
            f"--workers {workers} needs --concurrency of at least {workers} "
            f"(each worker keeps at least one request in flight), got {spec.concurrency}"
        )
    limit = spec.request_limit()
    if limit is not None and limit < workers:
        raise ValueError(f"--workers {workers} needs at least {workers} requests, got {limit}")
    shares = []
    for w in range(workers):
        shares.append(
            replace(
                spec,
                concurrency=None
                if spec.concurrency is None
                else _share(spec.concurrency, workers, w),
                rate=None if spec.rate is None else spec.rate / workers,
                requests=None if limit is None else _share(limit, workers, w),
                warmup=_share(spec.warmup, workers, w),
                index_start=w,
                index_step=workers,
                arrival_seed=spec.seed + 7919 * w,
                # Constant arrivals: spread the workers' ticks evenly over one total period.
                # A closed loop's ramp: worker w's slots start w ramp steps later.
                arrival_offset=_offset(spec, w),
            )
        )
    return shares


class ForwardingMetrics(LoadgenMetrics):
    """A worker's metrics: finished requests and step starts go to the parent's queue."""

    def __init__(self, out: Queue[Message], worker: int):
        super().__init__()
        self.out, self.worker = out, worker
        self.batch: list[RequestRecord] = []
        self.last_flush = time.monotonic()

    def start_step(self, start: StepStart) -> None:
        """Tell the parent that this worker's step started (the parent publishes it once)."""
        super().start_step(start)
        self.out.put(("start", self.worker, start))

    def observe(self, record: RequestRecord) -> None:
        """Queue one finished request; forward a batch when it is big or old enough."""
        self.batch.append(record)
        if len(self.batch) >= BATCH_RECORDS or time.monotonic() - self.last_flush > BATCH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Forward the pending records and this worker's in-flight count per engine."""
        engines = {r.engine for r in self.batch}
        in_flight = {
            e: self.registry.get_sample_value(llmb.LOADGEN_REQUESTS_IN_FLIGHT, {"engine": e}) or 0.0
            for e in engines
        }
        self.out.put(("records", self.worker, self.batch, in_flight))
        self.batch = []
        self.last_flush = time.monotonic()


# How long a worker waits for the others before starting alone.
START_TIMEOUT_SECONDS = 60.0


def _worker_main(
    spec: RunSpec,
    worker: int,
    out: Queue[Message],
    exporter_url: str | None,
    prometheus_url: str | None,
    log_level: str,
    start: Barrier | None = None,
) -> None:
    """Entry point of one worker process."""
    from loadgen.sweep import probe_factory

    logging.basicConfig(
        level=log_level, format=f"%(asctime)s %(levelname)s worker{worker} %(name)s: %(message)s"
    )
    metrics = ForwardingMetrics(out, worker)
    options = SessionOptions(
        out_dir=None,
        metrics_port=0,
        # Server-side probes measure the engine, not the client: one worker is enough.
        probe_factory=probe_factory(exporter_url, prometheus_url) if worker == 0 else None,
        progress=False,
        print_table=False,
        metrics=metrics,
    )
    servers: dict[str, ServerFigures] = {}
    if start is not None:
        # Spawned processes take different times to import; without a common start the
        # first worker can be half done before the last begins, and the shares of the
        # concurrency and the rate never overlap as one load.
        try:
            start.wait(timeout=START_TIMEOUT_SECONDS)
        except threading.BrokenBarrierError:
            logging.getLogger(__name__).warning("worker %d: starting without the others", worker)
    try:
        result = run(execute([spec], options))
        metrics.flush()
        for step in result.summary.steps:
            if step.server is not None:
                servers[step.engine] = step.server
        # A worker's own abort (engine gone, too many errors) ends the whole run.
        summary = result.summary
        error = result.error
        if error is None and summary.aborted and not summary.interrupted:
            error = f"worker {worker}: {summary.abort_reason}"
        out.put(("done", worker, result.exit_code, error, servers))
    except BaseException as exc:  # the parent must hear about any end of a worker
        out.put(("done", worker, EXIT_FAILED, f"worker {worker}: {exc!r}", servers))
        raise


class _Merger:
    """The parent's side: live metrics, requests.jsonl and the merged records."""

    def __init__(self, spec: RunSpec, metrics: LoadgenMetrics, writer: JsonlWriter | None):
        self.spec, self.metrics, self.writer = spec, metrics, writer
        self.records: dict[str, list[RequestRecord]] = {t.name: [] for t in spec.targets}
        self.in_flight: dict[tuple[int, str], float] = {}
        self.started: set[str] = set()
        self.done: dict[int, tuple[int, str | None, dict[str, ServerFigures]]] = {}

    def handle(self, message: Message) -> None:
        """Apply one message from a worker."""
        kind, worker = message[0], message[1]
        if kind == "start":
            start: StepStart = message[2]
            if start.engine not in self.started:
                self.started.add(start.engine)
                # The run's concurrency, not this worker's share of it.
                self.metrics.start_step(start._replace(concurrency=self.spec.concurrency))
        elif kind == "records":
            _, _, batch, in_flight = message
            if self.writer is not None:
                self.writer.write_many(batch)
            for record in batch:
                self.records.setdefault(record.engine, []).append(record)
                self.metrics.observe(record)
            for engine, value in in_flight.items():
                self.in_flight[(worker, engine)] = value
                total = sum(v for (_, e), v in self.in_flight.items() if e == engine)
                self.metrics.in_flight.labels(engine).set(total)
        elif kind == "done":
            _, _, code, error, servers = message
            self.done[worker] = (code, error, servers)


def merge_step(
    spec: RunSpec,
    records: dict[str, list[RequestRecord]],
    servers: dict[str, ServerFigures],
    workers: int,
    interrupted: bool,
) -> StepResult:
    """One StepResult from every worker's records of the step (percentiles recomputed)."""
    summaries = []
    by_engine: dict[str, list[RequestRecord]] = {}
    for target in spec.targets:
        recs = sorted(records.get(target.name, []), key=lambda r: (r.start_time, r.index))
        if not recs:
            continue
        # The workers' phases overlap but do not start at the same instant: the step's wall
        # time is the span from the first request sent to the last one finished.
        wall = max(r.end_time for r in recs) - min(r.start_time for r in recs)
        summaries.append(
            engine_summary(
                recs, spec, target, step=0, wall_s=wall, workers=workers,
                server=servers.get(target.name),
            )
        )  # fmt: skip
        by_engine[target.name] = recs
    reasons = step_reasons(by_engine, spec.max_tokens)
    mark_validity(summaries, reasons, per_engine=False)
    return StepResult(0, spec, summaries, by_engine, reasons, interrupted)


async def _receive(merger: _Merger, procs: Sequence[BaseProcess], inbox: Queue[Message]) -> None:
    """Start the workers, apply their messages until each reported its end, then join them."""
    loop = asyncio.get_running_loop()
    for proc in procs:
        proc.start()
    gone_since: float | None = None
    while len(merger.done) < len(procs):
        try:
            message = await loop.run_in_executor(None, inbox.get, True, 0.2)
        except queue.Empty:
            # A worker killed hard never sends "done": stop waiting for it after a grace.
            if all(not p.is_alive() for p in procs):
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 2.0:
                    break
            continue
        merger.handle(message)
    for proc in procs:
        proc.join(JOIN_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _worker_errors(merger: _Merger, procs: Sequence[BaseProcess]) -> list[str]:
    """Each distinct failure the workers reported, and the workers that never reported."""
    # The same failure (an unreachable target) is usually reported by every worker: once is enough.
    errors = list(dict.fromkeys(err for _, err, _ in merger.done.values() if err))
    missing = [w for w in range(len(procs)) if w not in merger.done]
    if missing:
        errors.append(f"workers {missing} ended without reporting (exit codes "
                      f"{[procs[w].exitcode for w in missing]})")  # fmt: skip
    return errors


async def execute_workers(
    spec: RunSpec,
    options: SessionOptions,
    workers: int,
    probe_urls: tuple[str | None, str | None] = (None, None),
    log_level: str = "INFO",
) -> SessionResult:
    """Run `spec` on `workers` processes and merge their requests into one report."""
    shares = split_spec(spec, workers)
    metrics = options.metrics or LoadgenMetrics(options.slo)
    if options.metrics_port:
        await serve_metrics(metrics, options.metrics_host, options.metrics_port)
    writer = JsonlWriter(options.out_dir / "requests.jsonl") if options.out_dir else None
    merger = _Merger(spec, metrics, writer)
    ctx = multiprocessing.get_context("spawn")
    inbox = ctx.Queue()
    start = ctx.Barrier(workers)
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(share, w, inbox, probe_urls[0], probe_urls[1], log_level, start),
            name=f"llmb-loadgen-worker{w}",
            daemon=True,
        )
        for w, share in enumerate(shares)
    ]
    interrupted = False

    def on_signal(signum: int) -> None:
        # Each worker stops its own requests on SIGINT and still reports what finished.
        nonlocal interrupted
        interrupted = True
        log.warning("signal %d: stopping the workers; finished requests are kept", signum)
        for proc in procs:
            if proc.pid is not None and proc.exitcode is None:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGINT)

    with signals_handled(on_signal):
        try:
            await _receive(merger, procs, inbox)
        finally:
            if writer is not None:
                writer.close()
            await metrics.close()
    errors = _worker_errors(merger, procs)
    interrupted = interrupted or any(c == EXIT_INTERRUPTED for c, _, _ in merger.done.values())
    servers: dict[str, ServerFigures] = {}
    for _, _, found in merger.done.values():
        servers.update(found)
    steps: list[StepResult] = []
    if any(merger.records.values()):
        steps.append(merge_step(spec, merger.records, servers, workers, interrupted))
        for name in steps[0].records:
            metrics.set_mismatch(name, bool(steps[0].reasons))
    run_info = dict(options.run_info, workers=workers)
    error = "; ".join(errors) or None
    abort_reason = error
    if abort_reason is None and steps and steps[0].aborted:
        abort_reason = f"step 0: {steps[0].abort_reason}"
    if abort_reason is None and interrupted:
        abort_reason = "interrupted: stopped by a signal"
    return conclude(steps, options, run_info, interrupted, abort_reason, error)


def worker_count_error(spec: RunSpec, workers: int) -> str | None:
    """Why `spec` cannot run on `workers` processes, or None."""
    try:
        split_spec(spec, workers)
    except ValueError as exc:
        return str(exc)
    return None


__all__ = ["execute_workers", "merge_step", "split_spec", "worker_count_error"]
