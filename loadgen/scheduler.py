"""Scheduling: closed loop (N requests in flight) or open loop (Poisson/constant arrivals).

`run_step` runs one setting against every target in turn, with the same prompts in the same
order, and returns per-engine summaries plus the token verification. `RunContext` carries
what lives for a whole run (output writer, live metrics, progress, Ctrl-C flag, calibrated
prompts), so `run`, `sweep` and later commands (`diagnose`, `compare`) share one code path.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from loadgen.client import (
    CONNECT,
    EARLY_STOP,
    INTERRUPTED,
    TIMEOUT,
    StreamClient,
    StreamResult,
    Target,
    finish,
)
from loadgen.metrics import LoadgenMetrics
from loadgen.prompts import CalibrationError, PromptSet, calibrate, fixed_prompt
from loadgen.results import (
    JsonlWriter,
    RequestRecord,
    build_record,
    step_reasons,
    summarize,
)

log = logging.getLogger(__name__)

DEFAULT_REQUESTS = 32
OPEN_LOOP_MAX_IN_FLIGHT = 1024
# The error share (`max_error_share`) is judged only once this many requests finished, so one
# early failure does not end a step (except with a share of 0).
MIN_REQUESTS_FOR_ERROR_SHARE = 8
# Abort reasons (the `abort_reason` of a step and of summary.json start with one of these).
ABORT_ENGINE_GONE = "engine gone"
ABORT_NOT_ANSWERING = "engine not answering"
ABORT_TOO_MANY_ERRORS = "too many errors"
ABORT_DEADLINE = "step deadline"
ABORT_INTERRUPTED = "interrupted"


@dataclass
class RunSpec:
    """One load setting. `concurrency` is the closed-loop width, or with `rate` a cap."""

    targets: list[Target]
    max_tokens: int = 128
    concurrency: int | None = 1
    rate: float | None = None
    arrival: str = "poisson"  # poisson | constant (open loop only)
    requests: int | None = None
    duration: float | None = None
    warmup: int = 0
    timeout: float = 600.0
    endpoint: str = "chat"  # chat | completions
    cache: str = "unique"  # unique | same
    prompt_tokens: int | None = 512
    prompt_text: str | None = None  # from --prompt-file; wins over prompt_tokens
    seed: int = 1234
    connect_timeout: float = 5.0
    abort_after_connect_errors: int = 20
    # Abort the step when more than this share of its finished requests failed (None: never).
    max_error_share: float | None = None
    # Hard limit of one engine's phase in seconds (None: derived, see `phase_deadline()`).
    step_timeout: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    # Worker processes (`--workers`): this share sends prompt/record indexes
    # index_start + i * index_step, so the shares never repeat a prompt and merge into 0..n-1.
    index_start: int = 0
    index_step: int = 1
    # Open loop: seed and start offset of this share's arrival clock (None: `seed`), so the
    # shares do not fire in lockstep.
    arrival_seed: int | None = None
    arrival_offset: float = 0.0

    def request_params(self) -> dict[str, Any]:
        """Sampling parameters sent with every request (output length exact, deterministic)."""
        params: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "seed": self.seed,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        params.update(self.extra_body)
        return params

    def pool_size(self) -> int:
        """Connections to pre-open: one per request that can be in flight."""
        if self.rate is None:
            return max(1, self.concurrency or 1)
        return max(1, min(self.concurrency or OPEN_LOOP_MAX_IN_FLIGHT, OPEN_LOOP_MAX_IN_FLIGHT))

    def preopen_count(self) -> int:
        """Connections worth opening before a phase (open loop: the in-flight count is unknown)."""
        return self.pool_size() if self.rate is None else min(self.pool_size(), 64)

    def phase_deadline(self, measured: bool = True) -> float:
        """Seconds one engine's phase may take before it is cut, whatever the engine does.

        `step_timeout` when given; else the worst case of a live engine: the phase's waves
        (requests / concurrency, rounded up) each bounded by the per-request `timeout`, or the
        `duration` plus one `timeout` for the requests in flight at its end.
        """
        if self.step_timeout is not None:
            return self.step_timeout
        if measured and self.duration is not None:
            return self.duration + self.timeout + self.connect_timeout
        count = (self.request_limit() if measured else self.warmup) or 1
        if self.rate is not None:
            # Arrivals alone take count / rate; the last request then has its own timeout.
            return count / self.rate + self.timeout + self.connect_timeout
        waves = -(-count // max(1, self.concurrency or 1))
        return waves * (self.timeout + self.connect_timeout)

    def request_limit(self) -> int | None:
        """Measured requests to send (None: until `duration`)."""
        if self.requests is None and self.duration is None:
            return DEFAULT_REQUESTS
        return self.requests


class Probe(Protocol):
    """Samples server-side state (GPU memory, KV usage, queue) while one engine runs a step."""

    async def start(self) -> None: ...

    async def stop(self) -> dict[str, Any]: ...


ProbeFactory = Callable[[Target], Probe]


@dataclass
class StepResult:
    """What one step produced: summaries and records per engine, and the verification."""

    step: int
    spec: RunSpec
    summaries: list[dict[str, Any]]
    records: dict[str, list[RequestRecord]]
    reasons: list[str]
    interrupted: bool = False
    # The step stopped before its planned end (engine gone, too many errors, deadline,
    # interrupted); `abort_reason` says which and why.
    aborted: bool = False
    abort_reason: str | None = None

    @property
    def valid(self) -> bool:
        return not self.reasons and not self.aborted


class Progress:
    """A tqdm bar with live tok/s and errors on a terminal, plain log lines otherwise."""

    def __init__(self, enabled: bool | None = None, interval: float = 5.0):
        self.tty = sys.stderr.isatty() if enabled is None else enabled
        self.interval = interval
        self._bar: Any = None
        self._t0 = 0.0
        self._last = 0.0
        self._label = ""
        self.done = self.errors = self.tokens = 0
        self.total: int | None = None

    def begin(self, label: str, total: int | None) -> None:
        """Start counting one engine's step."""
        self._label, self.total = label, total
        self.done = self.errors = self.tokens = 0
        self._t0 = self._last = time.perf_counter()
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="req", leave=True, dynamic_ncols=True)

    def update(self, record: RequestRecord) -> None:
        """Count one finished request."""
        self.done += 1
        self.tokens += record.completion_tokens or 0
        if record.error is not None:
            self.errors += 1
        now = time.perf_counter()
        rate = self.tokens / (now - self._t0) if now > self._t0 else 0.0
        if self._bar is not None:
            self._bar.update(1)
            if now - self._last > 0.25:
                self._bar.set_postfix(tok_s=f"{rate:.0f}", errors=self.errors, refresh=False)
                self._last = now
        elif now - self._last >= self.interval:
            self._last = now
            log.info(
                "%s: %d%s requests, %d errors, %.1f output tok/s",
                self._label,
                self.done,
                f"/{self.total}" if self.total else "",
                self.errors,
                rate,
            )

    def end(self) -> None:
        """Close the bar (or log the final line)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            elapsed = time.perf_counter() - self._t0
            log.info(
                "%s: finished %d requests, %d errors in %.1f s",
                self._label,
                self.done,
                self.errors,
                elapsed,
            )


class RunContext:
    """State shared by the steps of one run."""

    def __init__(
        self,
        out_dir: Path | None,
        metrics: LoadgenMetrics | None = None,
        progress: Progress | None = None,
        probe_factory: ProbeFactory | None = None,
    ):
        self.out_dir = out_dir
        self.metrics = metrics
        self.progress = progress or Progress(enabled=False, interval=5.0)
        self.probe_factory = probe_factory
        self.writer = JsonlWriter(out_dir / "requests.jsonl") if out_dir else None
        self.stop = asyncio.Event()
        self.prompts: dict[tuple[Any, ...], PromptSet] = {}

    def record(self, record: RequestRecord) -> None:
        """Persist and publish one finished request."""
        self.record_many((record,))

    def record_many(self, records: Sequence[RequestRecord]) -> None:
        """Persist (one write and flush) and publish a batch of finished requests."""
        if self.writer is not None:
            self.writer.write_many(records)
        for record in records:
            if self.metrics is not None:
                self.metrics.observe(record)
            self.progress.update(record)

    def close(self) -> None:
        """Flush and close the outputs."""
        if self.writer is not None:
            self.writer.close()


async def _count_by_probe(client: StreamClient, spec: RunSpec, text: str, attempts: int = 3) -> int:
    params = spec.request_params() | {"max_tokens": 1}
    result = StreamResult()
    # A probe is one request like any other: retry a transient failure before giving up.
    for _ in range(attempts):
        result = await client.stream(client.build_body(text, params), spec.timeout)
        if result.usage is not None and "prompt_tokens" in result.usage:
            return int(result.usage["prompt_tokens"])
    raise RuntimeError(
        f"cannot count prompt tokens on {client.target.name}: "
        f"{result.error or 'no usage'} {result.error_detail or ''}".strip()
    )


async def _count_by_tokenize(client: StreamClient, text: str) -> int:
    data = await client.post_json("/tokenize", {"content": text, "add_special": True})
    return len(data["tokens"])


async def prompts_for(ctx: RunContext, spec: RunSpec, client: StreamClient) -> PromptSet:
    """The prompt set of this spec, calibrated once per run on the first target."""
    if spec.prompt_text is not None:
        return fixed_prompt(spec.prompt_text, spec.cache)
    key = (spec.prompt_tokens, spec.cache, spec.endpoint)
    if key not in ctx.prompts:
        if spec.prompt_tokens is None:
            raise ValueError("either prompt_tokens or prompt_text is required")

        # llama.cpp's /tokenize (with BOS) equals the prompt_tokens of /v1/completions and
        # costs no prefill; the chat template adds tokens only a real request can count.
        async def count(text: str) -> int:
            if client.target.kind == "llamacpp" and spec.endpoint == "completions":
                return await _count_by_tokenize(client, text)
            return await _count_by_probe(client, spec, text)

        ctx.prompts[key] = await calibrate(spec.prompt_tokens, count, spec.cache)
    return ctx.prompts[key]


def calibration_deadline(spec: RunSpec) -> float:
    """Seconds the prompt calibration may take: a few probes' worth of `timeout`."""
    return 3 * spec.timeout + spec.connect_timeout


async def _calibrate_within(ctx: RunContext, spec: RunSpec, client: StreamClient) -> PromptSet:
    limit = calibration_deadline(spec)
    try:
        return await asyncio.wait_for(prompts_for(ctx, spec, client), timeout=limit)
    except asyncio.TimeoutError:
        raise CalibrationError(
            f"{client.target.name}: prompt calibration not finished within {limit:g} s "
            "(the engine does not answer; see --timeout)"
        ) from None


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


# While a phase measures, the cyclic garbage collector runs only at these intervals (a young
# collection, about a millisecond): a full collection in the middle of a phase stalls the
# event loop for several milliseconds and lands in the inter-token gaps of every stream.
GC_INTERVAL_S = 5.0
# A due collection waits for quiet reads (see QUIET_S), but at most this long.
GC_MAX_DELAY_S = 1.0

# Finished requests are settled (parsed, recorded, written to requests.jsonl, published to
# the live metrics and the progress) by a recorder task, off the read path: only once no
# stream has read anything for QUIET_S. Streams of a batch get their tokens together (an
# engine decodes one step for all of them; the stub's clock ticks for all), so the reads
# come in bursts with quiet gaps between them, and work done in a gap delays no timestamp.
QUIET_S = 0.002
# ... but a finished request never waits longer than this for its record: reads that never
# pause (a zero-delay server, many unaligned streams) get one record per event-loop turn.
MAX_DEFER_S = 0.25
# Settling work per event-loop turn in a quiet gap: a read that arrives meanwhile waits for
# the slice to end (a request costs ~0.1 ms), then the quiet is checked again.
SETTLE_SLICE_S = 0.0005
# Request bodies kept built ahead, per connection of the pool (a closed loop's next wave),
# within a memory budget (long prompts: fewer ahead; the rest are built when sent).
PREBUILT_PER_SLOT = 2
PREBUILT_BYTES = 16 * 2**20


@contextlib.contextmanager
def _quiet_gc(enabled: bool, quiet: Callable[[], float] | None = None) -> Iterator[None]:
    """Freeze what exists, pause automatic collections, collect young objects on a timer.

    `quiet()` (seconds until the reads are quiet, 0 when they are) delays a due
    collection into a gap between reads, by at most GC_MAX_DELAY_S.
    """
    if not enabled or not gc.isenabled():
        yield
        return
    gc.collect()
    gc.freeze()
    gc.disable()
    loop = asyncio.get_running_loop()
    handle: asyncio.TimerHandle | None = None
    due = 0.0

    def young() -> None:
        nonlocal handle, due
        now = time.perf_counter()
        wait = quiet() if quiet is not None else 0.0
        if wait > 0 and now - due < GC_MAX_DELAY_S:
            handle = loop.call_later(wait, young)
            return
        gc.collect(1)
        due = time.perf_counter() + GC_INTERVAL_S
        handle = loop.call_later(GC_INTERVAL_S, young)

    due = time.perf_counter() + GC_INTERVAL_S
    handle = loop.call_later(GC_INTERVAL_S, young)
    try:
        yield
    finally:
        handle.cancel()
        gc.enable()
        gc.unfreeze()


class _Phase:
    """One engine's warm-up or measured phase of a step."""

    def __init__(
        self,
        ctx: RunContext,
        spec: RunSpec,
        client: StreamClient,
        prompts: PromptSet,
        step: int,
        measured: bool,
    ):
        self.ctx, self.spec, self.client, self.prompts = ctx, spec, client, prompts
        self.step, self.measured = step, measured
        self.engine = client.target.name
        self.records: list[RequestRecord] = []
        self.limit = spec.request_limit() if measured else spec.warmup
        self.deadline: float | None = None
        self.next_index = 0
        self.connect_errors = 0
        self.timeouts = 0
        self.failures = 0
        self.finished = 0
        self.aborted = asyncio.Event()
        self.abort_reason: str | None = None
        self._pending: collections.deque[tuple[int, StreamResult]] = collections.deque()
        self._wake = asyncio.Event()
        self.build = client.body_builder(spec.request_params())
        self.wall_offset = time.time() - time.perf_counter()
        # Resolved once: labels() takes a lock and builds a key on every call.
        self.gauge = ctx.metrics.in_flight.labels(self.engine) if ctx.metrics else None
        # Request bodies built ahead (index -> body), so sending one costs no prompt or JSON
        # work; topped up in the gaps between reads, like the records.
        self._bodies: dict[int, bytes] = {}
        self._built_to = 0
        self._body_size = 0
        self.prebuild()

    def claim(self) -> int | None:
        """Index of the next request to send, or None when the phase is over."""
        if self.ctx.stop.is_set() or self.aborted.is_set():
            return None
        if self.limit is not None and self.next_index >= self.limit:
            return None
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return None
        index = self.next_index
        self.next_index += 1
        return index

    def _body(self, index: int) -> bytes:
        """The request body of (global) prompt index `index`."""
        text = self.prompts.text(index) if self.measured else self.prompts.warmup_text(index)
        return self.build(text)

    def prebuild(self, until: float | None = None) -> None:
        """Build ahead the bodies of the next requests to send (see PREBUILT_PER_SLOT).

        With `until` (a perf_counter time) it stops there: a slice of a gap between reads.
        """
        stop = self.next_index + PREBUILT_PER_SLOT * self.spec.pool_size()
        if self.limit is not None:
            stop = min(stop, self.limit)
        start, step = self.spec.index_start, self.spec.index_step
        number = max(self._built_to, self.next_index)
        perf = time.perf_counter
        while number < stop and len(self._bodies) * self._body_size < PREBUILT_BYTES:
            if until is not None and perf() >= until:
                break
            body = self._body(start + number * step)
            self._bodies[number] = body
            self._body_size = max(self._body_size, len(body))
            number += 1
        self._built_to = max(self._built_to, number)

    async def one(self, number: int) -> None:
        index = self.spec.index_start + number * self.spec.index_step
        body = self._bodies.pop(number, None) or self._body(index)
        gauge = self.gauge
        if gauge is not None:
            gauge.inc()
        result: StreamResult | None = None
        try:
            # Unparsed: the stream's reads are parsed by the recorder, off the hot path.
            result = await self.client.stream(body, self.spec.timeout, parse=False)
        finally:
            if gauge is not None:
                gauge.dec()
            if result is None and self.measured:
                # Cancelled (Ctrl-C or the phase deadline): keep a record that it was sent.
                now = time.perf_counter()
                if self.ctx.stop.is_set():
                    cut = StreamResult(t_send=now, t_end=now, error=INTERRUPTED)
                    cut.error_detail = "run interrupted before the request finished"
                else:
                    cut = StreamResult(t_send=now, t_end=now, error=TIMEOUT)
                    cut.error_detail = "cut at the step deadline"
                self._keep(build_record(cut, **self._meta(index)))
        # A refused connection is known without parsing: count it at once, so a dead
        # engine stops the phase before many more requests go out.
        if result.error == CONNECT:
            self._count_connect_error()
        else:
            self.connect_errors = 0
        # An engine that accepts connections but never answers (stopped, wedged) shows as
        # timeouts: one full round of them in a row, and nothing will come back.
        if result.error == TIMEOUT:
            self.timeouts += 1
            limit = max(2, self.spec.concurrency or 2)
            if self.timeouts >= limit:
                self.abort(
                    f"{ABORT_NOT_ANSWERING}: {self.engine}: {self.timeouts} requests in a row "
                    f"timed out after {self.spec.timeout:g} s"
                )
        else:
            self.timeouts = 0
        if not self.measured:
            return
        if result.error is not None:
            # A failure is settled at once: the error-share rule must stop a failing step
            # promptly, and a failing step has no timing left to protect.
            self._keep_many([self._settle(index, result)])
        else:
            self._pending.append((index, result))
            self._wake.set()

    def _settle(self, index: int, result: StreamResult) -> RequestRecord:
        """Parse one finished request into its record and apply the error-share rule."""
        record = build_record(finish(result), **self._meta(index))
        self.finished += 1
        if record.error is not None and record.error not in (EARLY_STOP, INTERRUPTED):
            self.failures += 1
        share = self.spec.max_error_share
        if share is not None and self.failures and not self.aborted.is_set():
            judged = share == 0 or self.finished >= MIN_REQUESTS_FOR_ERROR_SHARE
            if judged and self.failures > share * self.finished:
                self.abort(
                    f"{ABORT_TOO_MANY_ERRORS}: {self.engine}: {self.failures} of "
                    f"{self.finished} requests failed (limit {share:.0%}); last: "
                    f"{record.error} {record.error_detail or ''}".rstrip()
                )
        return record

    def quiet_in(self, now: float) -> float:
        """Seconds until the reads have been quiet for QUIET_S (0: quiet now)."""
        return max(0.0, self.client.last_read + QUIET_S - now)

    def _settle_slice(self, until: float) -> None:
        """Settle pending requests until `until` (at least one) or until a read arrives."""
        perf = time.perf_counter
        mark = self.client.last_read
        batch = [self._settle(*self._pending.popleft())]
        while self._pending and perf() < until and self.client.last_read == mark:
            batch.append(self._settle(*self._pending.popleft()))
        self._keep_many(batch)

    async def _recorder(self) -> None:
        """Settle finished requests in the gaps between reads (see QUIET_S).

        Once the oldest one has waited MAX_DEFER_S, one is settled per event-loop turn
        whatever the reads do, so the sockets are polled between any two of them.
        """
        perf = time.perf_counter
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = perf()
            wait = self.quiet_in(now)
            overdue_in = self._pending[0][1].t_end + MAX_DEFER_S - now
            if wait > 0 and overdue_in > 0:
                await asyncio.sleep(min(wait, overdue_in))
                continue
            self._settle_slice(now + SETTLE_SLICE_S if wait == 0 else now)
            if wait == 0 and self.quiet_in(perf()) == 0:
                self.prebuild(perf() + SETTLE_SLICE_S)
            await asyncio.sleep(0)

    def _drain(self) -> None:
        batch = []
        while self._pending:
            batch.append(self._settle(*self._pending.popleft()))
        self._keep_many(batch)

    def _count_connect_error(self) -> None:
        self.connect_errors += 1
        if self.connect_errors >= self.spec.abort_after_connect_errors:
            self.abort(
                f"{ABORT_ENGINE_GONE}: {self.engine}: {self.connect_errors} connection errors "
                f"in a row ({self.client.target.url})"
            )

    def abort(self, reason: str) -> None:
        """Stop sending: requests in flight finish (bounded by their timeout), none start."""
        if not self.aborted.is_set():
            log.error("%s; stopping", reason)
            self.abort_reason = reason
            self.aborted.set()

    def _meta(self, index: int) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "step": self.step,
            "index": index,
            "max_tokens": self.spec.max_tokens,
            "wall_offset": self.wall_offset,
        }

    def _keep(self, record: RequestRecord) -> None:
        self._keep_many([record])

    def _keep_many(self, records: list[RequestRecord]) -> None:
        if records:
            self.records.extend(records)
            self.ctx.record_many(records)

    async def run(self) -> float:
        """Run the phase within its hard deadline; return its wall time in seconds.

        At the deadline the requests in flight are cancelled and recorded as `timeout`, and
        the phase is aborted: a run never hangs on an engine that stopped answering.
        """
        t0 = time.perf_counter()
        if self.measured and self.spec.duration is not None:
            self.deadline = t0 + self.spec.duration
        limit = self.spec.phase_deadline(self.measured)
        if self.spec.rate is None:
            workers = max(1, self.spec.concurrency or 1)
            body: Awaitable[Any] = asyncio.gather(*(self._worker() for _ in range(workers)))
        else:
            body = self._open_loop(self.spec.rate)
        recorder = asyncio.create_task(self._recorder())
        try:
            with _quiet_gc(self.measured, lambda: self.quiet_in(time.perf_counter())):
                await asyncio.wait_for(body, timeout=limit)
        except asyncio.TimeoutError:
            self.abort(f"{ABORT_DEADLINE}: {self.engine}: phase not finished within {limit:.0f} s")
        finally:
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
            self._drain()
        return time.perf_counter() - t0

    async def _worker(self) -> None:
        while (index := self.claim()) is not None:
            await self.one(index)

    async def _open_loop(self, rate: float) -> None:
        seed = self.spec.seed if self.spec.arrival_seed is None else self.spec.arrival_seed
        rng = random.Random(seed)
        cap = asyncio.Semaphore(self.spec.pool_size())
        tasks: set[asyncio.Task[None]] = set()

        async def launch(index: int) -> None:
            try:
                await self.one(index)
            finally:
                cap.release()

        t_next = time.perf_counter() + self.spec.arrival_offset
        try:
            while True:
                delay = t_next - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                index = self.claim()
                if index is None:
                    break
                # At the cap the arrival waits: the run reports it as lower achieved rate.
                await cap.acquire()
                task = asyncio.create_task(launch(index))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                gap = rng.expovariate(rate) if self.spec.arrival == "poisson" else 1.0 / rate
                t_next += gap
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)


async def run_step(
    spec: RunSpec,
    ctx: RunContext,
    step: int = 0,
    metrics_ptokens: int | None = None,
) -> StepResult:
    """Run one setting on every target in turn (same prompts, same order) and verify tokens.

    Raises TargetUnreachable when a target does not answer at all.
    """
    summaries: list[dict[str, Any]] = []
    by_engine: dict[str, list[RequestRecord]] = {}
    prompts: PromptSet | None = None
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
                prompts = await _calibrate_within(ctx, spec, client)
            ptok = prompts.measured_tokens or spec.prompt_tokens
            if spec.warmup:
                warm = _Phase(ctx, spec, client, prompts, step, measured=False)
                log.info("%s: %d warm-up requests", target.name, spec.warmup)
                if await _wait_or_stop(warm.run(), ctx.stop):
                    interrupted = True
                    break
                if warm.abort_reason is not None:
                    abort_reason = f"warm-up: {warm.abort_reason}"
                    break
            if ctx.metrics is not None:
                ctx.metrics.start_step(
                    target.name, step, spec.concurrency, metrics_ptokens or ptok, spec.max_tokens
                )
            probe = ctx.probe_factory(target) if ctx.probe_factory else None
            if probe is not None:
                await probe.start()
            await client.preopen(spec.preopen_count())
            phase = _Phase(ctx, spec, client, prompts, step, measured=True)
            ctx.progress.begin(f"{target.name} step {step}", phase.limit)
            t0 = time.perf_counter()
            try:
                stopped = await _wait_or_stop(phase.run(), ctx.stop)
            finally:
                ctx.progress.end()
            wall = time.perf_counter() - t0
            interrupted = interrupted or stopped
            summary = summarize(
                phase.records,
                engine=target.name,
                step=step,
                concurrency=spec.concurrency,
                rate=spec.rate,
                prompt_tokens_target=spec.prompt_tokens if spec.prompt_text is None else None,
                max_tokens=spec.max_tokens,
                wall_s=wall,
            )
            summary["kind"] = target.kind
            summary["endpoint"] = spec.endpoint
            summary["cache"] = spec.cache
            summary["model"] = client.model
            if probe is not None:
                summary["server"] = await probe.stop()
            summaries.append(summary)
            by_engine[target.name] = phase.records
            if phase.abort_reason is not None:
                abort_reason = phase.abort_reason
                break
            if stopped:
                break
    if interrupted and abort_reason is None:
        abort_reason = f"{ABORT_INTERRUPTED}: stopped by a signal before the step's end"
    reasons = step_reasons(by_engine, spec.max_tokens)
    if abort_reason is not None:
        reasons.append(f"aborted: {abort_reason}")
    if ctx.metrics is not None:
        for name in by_engine:
            ctx.metrics.set_mismatch(name, bool(reasons))
    for summary in summaries:
        summary["valid"] = not reasons
        summary["invalid_reasons"] = [r for r in reasons if _concerns(r, summary["engine"])]
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


def _concerns(reason: str, engine: str) -> bool:
    """Whether a step reason names this engine (reasons about the whole step concern all)."""
    return (
        f"{engine}:" in reason
        or f"{engine} vs " in reason
        or f" vs {engine}" in reason
        or (reason.startswith("aborted:"))
    )
