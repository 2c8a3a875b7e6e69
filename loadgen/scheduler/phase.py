"""One engine's warm-up or measured phase: send, time, settle records off the read path."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict
from urllib.parse import urlsplit

from loadgen.client import StreamClient, StreamResult, finish
from loadgen.outcomes import CANCELLED, CONNECT, EARLY_STOP, INTERRUPTED, TIMEOUT
from loadgen.results import RequestRecord, build_record
from loadgen.scheduler.context import Prompts, RunContext
from loadgen.scheduler.inflight import InFlight
from loadgen.scheduler.pacing import quiet_gc
from loadgen.scheduler.replay import Sender, replay_closed, replay_scheduled
from loadgen.scheduler.spec import RunSpec
from loadgen.traffic.prompts import TrafficPrompts

log = logging.getLogger(__name__)


class _Meta(TypedDict):
    """What a request's record takes from its phase (`build_record`'s keywords)."""

    engine: str
    step: int
    index: int
    max_tokens: int
    wall_offset: float
    prompt_tokens_target: int | None
    scheduled: float | None


# The error share (`max_error_share`) is judged only once this many requests finished, so one
# early failure does not end a step (except with a share of 0).
MIN_REQUESTS_FOR_ERROR_SHARE = 8
# Abort reasons (the `abort_reason` of a step and of summary.json start with one of these).
ABORT_ENGINE_GONE = "engine gone"
ABORT_NOT_ANSWERING = "engine not answering"
ABORT_TOO_MANY_ERRORS = "too many errors"
ABORT_DEADLINE = "step deadline"
ABORT_INTERRUPTED = "interrupted"

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
# Requests in flight and nothing read for this long: is the engine still accepting
# connections? A refusal means it is gone (llama-server, on SIGTERM, refuses new connections
# but keeps a stream it was serving open and silent until the client's timeout).
SILENT_S = 2.0


async def refuses_connections(url: str, timeout: float) -> bool:
    """True when nothing listens at `url`'s address any more (connection refused)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout)
    except ConnectionRefusedError:
        return True
    except (OSError, asyncio.TimeoutError):  # busy or unreachable: not proof it is gone
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


class EnginePhase:
    """One engine's warm-up or measured phase of a step."""

    def __init__(
        self,
        ctx: RunContext,
        spec: RunSpec,
        client: StreamClient,
        prompts: Prompts,
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
        self.in_flight = 0
        self.last_sent = 0.0
        self.aborted = asyncio.Event()
        self.abort_reason: str | None = None
        self._pending: collections.deque[tuple[int, StreamResult]] = collections.deque()
        self._wake = asyncio.Event()
        self.build = client.body_builder(spec.request_params())
        # --traffic: the lengths per request, a body builder per output length, and when
        # the replay meant each request to go out (index -> perf_counter).
        self.traffic = prompts if isinstance(prompts, TrafficPrompts) else None
        self._builders: dict[int, Callable[[str], bytes]] = {}
        self.due: dict[int, float] = {}
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
        if self.traffic is None:
            return self.build(text)
        out = self.traffic.output_tokens(index)
        build = self._builders.get(out)
        if build is None:
            params = self.spec.request_params() | {"max_tokens": out}
            build = self._builders[out] = self.client.body_builder(params)
        return build(text)

    def may_send(self) -> bool:
        """Whether a replay may still send (not stopped, aborted or past the duration)."""
        if self.ctx.stop.is_set() or self.aborted.is_set():
            return False
        return self.deadline is None or time.perf_counter() < self.deadline

    def sent_to(self, index: int) -> None:
        """A replay sends request `index` now: bodies are built ahead from there."""
        self.next_index = max(self.next_index, index + 1)

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
        self.in_flight += 1
        self.last_sent = sent = time.perf_counter()
        try:
            # Unparsed: the stream's reads are parsed by the recorder, off the hot path.
            result = await self.client.stream(body, self.spec.timeout, parse=False)
        finally:
            self.in_flight -= 1
            if gauge is not None:
                gauge.dec()
            if result is None and self.measured:
                # Cancelled (Ctrl-C, the step stopped, the phase deadline): keep its record.
                self._keep(build_record(self._cut(sent), **self._meta(index)))
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

    def _cut(self, sent: float) -> StreamResult:
        """The result of a request sent at `sent` and cancelled in flight, with why."""
        now = time.perf_counter()
        if self.ctx.stop.is_set():
            cut = StreamResult(t_send=sent, t_end=now, error=INTERRUPTED)
            cut.error_detail = "run interrupted before the request finished"
        elif self.abort_reason is not None:
            cut = StreamResult(t_send=sent, t_end=now, error=CANCELLED)
            cut.error_detail = f"cancelled in flight: {self.abort_reason}"
        else:
            cut = StreamResult(t_send=sent, t_end=now, error=TIMEOUT)
            cut.error_detail = "cut at the step deadline"
        return cut

    def _settle(self, index: int, result: StreamResult) -> RequestRecord:
        """Parse one finished request into its record and apply the error-share rule."""
        record = build_record(finish(result), **self._meta(index))
        self.finished += 1
        if record.error is not None and record.error not in (EARLY_STOP, INTERRUPTED, CANCELLED):
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
        """Stop the phase: none start, and `run` cancels those in flight (`cancelled`)."""
        if not self.aborted.is_set():
            log.error("%s; stopping", reason)
            self.abort_reason = reason
            self.aborted.set()

    def _meta(self, index: int) -> _Meta:
        traffic = self.traffic
        return {
            "engine": self.engine,
            "step": self.step,
            "index": index,
            "max_tokens": self.spec.max_tokens if traffic is None else traffic.output_tokens(index),
            "wall_offset": self.wall_offset,
            "prompt_tokens_target": None
            if traffic is None
            else traffic.traffic.requests[index].prompt_tokens,
            "scheduled": self.due.get(index),
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
        body: Awaitable[Any]
        if self.traffic is not None and self.measured:
            body = self._replay(self.traffic)
        elif self.spec.rate is None:
            workers = max(1, self.spec.concurrency or 1)
            body = asyncio.gather(*(self._worker(i) for i in range(workers)))
        else:
            body = self._open_loop(self.spec.rate)
        recorder = asyncio.create_task(self._recorder())
        watcher = asyncio.create_task(self._watch())
        try:
            with quiet_gc(self.measured, lambda: self.quiet_in(time.perf_counter())):
                if not await self._until_done_or_aborted(body, limit):
                    self.abort(
                        f"{ABORT_DEADLINE}: {self.engine}: phase not finished within {limit:.0f} s"
                    )
        finally:
            for task in (recorder, watcher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._drain()
        return time.perf_counter() - t0

    def _replay(self, prompts: TrafficPrompts) -> Awaitable[None]:
        sender = Sender(self.one, self.may_send, self.sent_to, self.due)
        if self.spec.open_loop():
            cap = self.spec.pool_size()
            # The schedule's clock starts when the replay does (after quiet_gc's collection).
            return replay_scheduled(prompts.traffic, sender, self.spec.time_scale, cap)
        return replay_closed(
            prompts.traffic, sender, self.spec.concurrency or 1, self.spec.time_scale
        )

    async def _watch(self) -> None:
        """Abort when the engine went silent and refuses connections (see SILENT_S)."""
        url = self.client.target.url
        while not self.aborted.is_set():
            await asyncio.sleep(SILENT_S)
            quiet = time.perf_counter() - max(self.client.last_read, self.last_sent)
            if self.in_flight and quiet >= SILENT_S:
                if await refuses_connections(url, self.spec.connect_timeout):
                    self.abort(
                        f"{ABORT_ENGINE_GONE}: {self.engine}: nothing read for {quiet:.0f} s "
                        f"with {self.in_flight} requests in flight, and {url} refuses "
                        "connections"
                    )

    async def _until_done_or_aborted(self, body: Awaitable[Any], limit: float | None) -> bool:
        """Run `body` until it ends, the phase is aborted or `limit` passes (False: passed).

        An aborted phase (too many errors, the engine gone or not answering) cancels the
        requests still in flight at once: against a dead engine each would otherwise sit out
        its whole `--timeout`, and the step's answer no longer depends on them.
        """
        task = asyncio.ensure_future(body)
        stopper = asyncio.ensure_future(self.aborted.wait())
        try:
            await asyncio.wait({task, stopper}, timeout=limit, return_when=FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
            # The cancelled requests record themselves (`one`), before the deadline's abort.
            results = await asyncio.gather(task, stopper, return_exceptions=True)
        error = results[0]
        if isinstance(error, BaseException) and not isinstance(error, asyncio.CancelledError):
            raise error
        finished = not isinstance(error, asyncio.CancelledError)
        return finished or self.aborted.is_set()

    async def _worker(self, slot: int) -> None:
        # With --ramp-up the workers start spread out. Equal requests then keep that spread,
        # so the server never reads a whole wave of C requests in one instant (which adds
        # its own read queue to every TTFT but the first).
        delay = self.spec.start_delay(slot)
        if delay > 0:
            await asyncio.sleep(delay)
        while (index := self.claim()) is not None:
            await self.one(index)

    async def _open_loop(self, rate: float) -> None:
        seed = self.spec.seed if self.spec.arrival_seed is None else self.spec.arrival_seed
        rng = random.Random(seed)
        flight = InFlight(self.spec.pool_size())

        async def launches() -> None:
            t_next = time.perf_counter() + self.spec.arrival_offset
            while True:
                delay = t_next - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                index = self.claim()
                if index is None:
                    break
                # At the cap the arrival waits: the run reports it as lower achieved rate.
                await flight.slot()
                flight.start(flight.send(self.one, index))
                gap = rng.expovariate(rate) if self.spec.arrival == "poisson" else 1.0 / rate
                t_next += gap

        await flight.run(launches())
