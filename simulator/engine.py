"""The scheduler shared by both simulated engines: admits, prefills and decodes requests.

Slots (llama.cpp) or max running requests (SGLang) and the KV capacity in tokens decide who
runs; the rest waits in a FIFO queue. Steps take the time `costs` gives them on the simulated
timeline of `Clock`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import zlib
from collections import deque
from collections.abc import Callable

from simulator.costs import StepCosts
from simulator.model import (
    Clock,
    EngineParams,
    GpuSpec,
    KvStyle,
    ModelSpec,
    Request,
    RequestError,
    Slot,
    Stats,
    lcp,
)
from simulator.tokenizer import GENERATION_WORDS, Tokenizer


class Engine(StepCosts):
    """The scheduler: admits, prefills and decodes requests on simulated time."""

    def __init__(
        self,
        style: KvStyle,
        model: ModelSpec,
        gpu: GpuSpec,
        params: EngineParams,
        tokenizer: Tokenizer,
        clock: Clock,
        log: Callable[[str, str], None] | None = None,
    ):
        self.style = style
        self.model = model
        self.gpu = gpu
        self.params = params
        self.tokenizer = tokenizer
        self.clock = clock
        self.log = log or (lambda level, line: None)
        self.stats = Stats()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.slots = [Slot(i) for i in range(params.n_slots)]
        self.n_ctx_slot = params.slot_ctx(model.n_ctx_train)
        self.radix: list[list[int]] = []  # SGLang prefix cache, most recent last
        self.finished: deque[Request] = deque(maxlen=256)  # recent requests, for tests and docs
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.loaded_at = params.load_seconds
        self.utilization = 0.0  # share of the last step spent reading memory
        self.vt = 0.0  # end of the last step on the simulated timeline
        # observers the SGLang metrics use (tokens evicted; a request retracted)
        self.on_evict: Callable[[int], None] | None = None
        self.on_retract: Callable[[Request], None] | None = None
        # the router's and the draft acceptance's dice (seeded: reproducible runs)
        self._route_rng = random.Random(params.spec_seed)
        self._spec_rng = random.Random(params.spec_seed + 1)
        self.last_routed_share = 0.0  # share of routed experts the last decode step read
        # Requests the scheduler could not admit when it last built a batch (SGLang's
        # num_queue_reqs: arrivals during a forward join at the next batch, not the queue).
        self.queued_after_admit = 0

    def kv_used(self) -> int:
        """Tokens held by running sequences."""
        return sum(r.n_tokens for r in self.running)

    def kv_cached_idle(self) -> int:
        """Tokens held as prefix cache but evictable (idle slots / radix tree)."""
        if not self.style.slots:
            return sum(len(t) for t in self.radix)
        return sum(len(s.tokens) for s in self.slots if s.request is None)

    def _evict_for(self, need: int) -> None:
        """Drop cached prefixes until `need` tokens fit in the pool."""
        cap = self.params.ctx_total
        if not self.style.slots:
            freed = 0
            while self.radix and self.kv_used() + self.kv_cached_idle() + need > cap:
                freed += len(self.radix.pop(0))
            if freed and self.on_evict is not None:
                self.on_evict(freed)
        elif self.params.kv_unified:
            idle = sorted((s for s in self.slots if s.request is None), key=lambda s: s.last_used)
            for slot in idle:
                if self.kv_used() + self.kv_cached_idle() + need <= cap:
                    break
                slot.tokens = []

    def new_request(
        self,
        prompt: list[int],
        max_tokens: int,
        ignore_eos: bool,
        temperature: float,
        seed: int | None,
        stream: bool = False,
    ) -> Request:
        """Validate and queue a request; the caller then reads `events` until None."""
        if not prompt:
            raise RequestError("the prompt is empty")
        limit = self.n_ctx_slot if self.style.slots else self.params.context_len
        if len(prompt) >= limit:
            raise RequestError(
                f"the request exceeds the available context size ({len(prompt)} >= {limit} tokens)"
            )
        if not self.style.slots and len(prompt) > self.params.ctx_total:
            raise RequestError("the prompt is larger than the KV cache pool")
        # Greedy decoding is a function of the prompt; sampling follows the seed when given.
        if temperature <= 0 or seed is not None:
            key = seed if seed is not None else zlib.crc32(str(prompt).encode())
            rng = random.Random(key)
        else:
            rng = random.Random()
        lo, hi = self.params.natural_len
        req = Request(
            id=next(self._ids),
            prompt=list(prompt),
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            rng=rng,
            natural_len=rng.randint(lo, hi),
            stream=stream,
            arrival=self.clock.now(),
        )
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        """Forget a request whose client went away."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self._finish(req, "stop")

    def start(self) -> None:
        """Run the scheduler loop in the current event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Cancel the scheduler loop."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def _admit(self) -> None:
        while self.waiting:
            req = self.waiting[0]
            if self.style.slots:
                slot = self._pick_slot(req)
                if slot is None:
                    return
                if self.params.kv_unified:
                    self._evict_for(req.uncached)
                    if (
                        self.kv_used() + self.kv_cached_idle() + req.uncached
                        > self.params.ctx_total
                    ):
                        return
                self.waiting.popleft()
                slot.request = req
                req.slot = slot.id
            else:
                if len(self.running) >= self.params.n_slots:
                    return
                req.cached = max((lcp(t, req.prompt) for t in self.radix), default=0)
                req.cached = min(req.cached, len(req.prompt) - 1)
                reserve = int(self.params.new_token_ratio * max(0, req.max_tokens))
                need = req.uncached + reserve
                self._evict_for(need)
                if self.kv_used() + self.kv_cached_idle() + need > self.params.ctx_total:
                    return
                self.waiting.popleft()
            req.admitted = max(self.vt, req.arrival)
            self.running.append(req)
            self.stats.prompt_cached += req.cached

    def _pick_slot(self, req: Request) -> Slot | None:
        free = [s for s in self.slots if s.request is None]
        if not free:
            return None
        best = max(free, key=lambda s: lcp(s.tokens, req.prompt))
        common = lcp(best.tokens, req.prompt)
        if common <= 0.1 * len(req.prompt):
            best = min(free, key=lambda s: s.last_used)
            common = lcp(best.tokens, req.prompt)
        req.cached = min(common, len(req.prompt) - 1)
        return best

    async def _loop(self) -> None:
        while True:
            await self.clock.sleep(max(0.0, self.loaded_at - self.clock.now()))
            self._admit()
            self.queued_after_admit = len(self.waiting)
            if not self.running:
                self._wake.clear()
                self.utilization = 0.0
                await self._wake.wait()
                self.vt = max(self.vt, self.clock.now())
                continue
            try:
                await self.step()
            except Exception:
                # A bug in one step must not freeze every client: log, fail the batch, go on.
                logging.getLogger("llmb-sim").exception("scheduler step failed")
                for req in list(self.running):
                    self._finish(req, "stop")

    async def step(self) -> None:
        """Run one batch: prefill the newly admitted requests, decode the others."""
        new = [r for r in self.running if not r.prefilled]
        decode = [r for r in self.running if r.prefilled]
        if not self.style.slots and decode:
            self._retract_if_full(decode)
            decode = [r for r in self.running if r.prefilled]
        prefill_tokens = sum(r.uncached for r in new)
        prompt = sum(len(r.prompt) for r in new) / len(new) if new else None
        t_prefill = self.prefill_seconds(prefill_tokens, prompt) if new else 0.0
        if new and not decode:
            t_prefill += self.params.step_overhead_s
        t_decode = self.decode_seconds(decode)
        # Steps chain on a virtual timeline and sleep to an absolute target, so event-loop
        # latency (large at small time scales) does not distort the reported timings.
        start = max([self.vt, *(r.arrival for r in new)])
        now = start + t_prefill + t_decode
        await self.clock.sleep(now - self.clock.now())
        self.vt = now
        st = self.stats
        st.n_decode += 1
        st.busy_slot_sum += len(self.running)
        if new:
            st.prompt_tokens += prefill_tokens
            st.prompt_seconds += t_prefill
            st.win_prompt_tokens += prefill_tokens
            st.win_prompt_seconds += t_prefill
            total = sum(len(r.prompt) for r in new)
            st.last_cache_hit_rate = sum(r.cached for r in new) / total if total else 0.0
            for req in new:
                req.recompute = 0
                req.prefilled = True
                req.prompt_done = now
                self._emit(req, now)  # the first token comes from the prompt logits
        emitted = sum(self._emit_step(req, now) for req in decode)
        if decode:
            st.decode_tokens += emitted
            st.decode_window.append((now, emitted))
        for req in list(self.running):
            self._check_stop(req)

    def _retract_if_full(self, decode: list[Request]) -> None:
        # SGLang retracts the newest requests when the next decode step cannot fit.
        while self.kv_used() + len(decode) > self.params.ctx_total and len(self.running) > 1:
            self._evict_for(len(decode))
            if self.kv_used() + len(decode) <= self.params.ctx_total:
                return
            victim = max(self.running, key=lambda r: r.admitted or 0.0)
            self.running.remove(victim)
            if victim in decode:
                decode.remove(victim)
            self.stats.retracted += 1
            self.stats.retracted_in += len(victim.prompt)
            self.stats.retracted_out += len(victim.generated)
            victim.retractions += 1
            if self.on_retract is not None:
                self.on_retract(victim)
            # It resumes later by recomputing its prompt and what it already generated.
            victim.recompute = len(victim.generated)
            victim.prefilled = False
            victim.cached = 0
            self.waiting.appendleft(victim)

    def _emit_step(self, req: Request, now: float) -> int:
        """The tokens one decode step gives `req`: one, or with a draft 1 + accepted drafts."""
        n_draft = self.params.spec_draft_max
        if n_draft <= 0:
            self._emit(req, now)
            return 1
        accepted = 0
        while accepted < n_draft and self._spec_rng.random() < self.params.spec_accept_p:
            accepted += 1
        room = req.max_tokens - len(req.generated) if req.max_tokens >= 0 else accepted + 1
        accepted = max(0, min(accepted, room - 1))
        st = self.stats
        st.spec_draft_tokens += n_draft
        st.spec_accepted += accepted
        st.spec_drafts += 1
        per_pos = st.spec_accepted_per_pos
        per_pos.extend([0] * (n_draft - len(per_pos)))
        for pos in range(accepted):
            per_pos[pos] += 1
        req.draft_n += n_draft
        req.draft_accepted += accepted
        req.n_drafts += 1
        for _ in range(accepted + 1):
            self._emit(req, now)
        return accepted + 1

    def _emit(self, req: Request, now: float) -> None:
        token = self.tokenizer.piece_id(req.rng.choice(GENERATION_WORDS))
        req.generated.append(token)
        req.last_token = now
        self.stats.n_tokens_max = max(self.stats.n_tokens_max, req.n_tokens - 1)
        req.events.put_nowait(token)

    def _check_stop(self, req: Request) -> None:
        n = len(req.generated)
        if req.max_tokens >= 0 and n >= req.max_tokens:
            self._finish(req, "length")
        elif not req.ignore_eos and n >= req.natural_len:
            self._finish(req, "stop")
        elif self.style.slots and req.n_tokens >= self.n_ctx_slot:
            req.truncated = True
            self._finish(req, "length")
        elif not self.style.slots and req.n_tokens >= self.params.context_len:
            self._finish(req, "length")
        elif (
            self.style.slots
            and self.params.kv_unified
            and self.kv_used() + len(self.running) > self.params.ctx_total
        ):
            self._evict_for(len(self.running))
            if self.kv_used() + len(self.running) > self.params.ctx_total:
                self.log(
                    "W",
                    "srv        decode: failed to find free space in the KV cache, retrying with "
                    f"smaller batch size, off = 0, n_batch = {len(self.running)}, ret = 1",
                )
                req.truncated = True
                self._finish(req, "length")

    def _finish(self, req: Request, reason: str) -> None:
        req.finish = reason
        if req in self.running:
            self.running.remove(req)
        n = len(req.generated)
        gen_s = (req.last_token or 0.0) - (req.prompt_done or 0.0)
        st = self.stats
        st.predicted_tokens += n
        st.predicted_seconds += gen_s
        st.win_pred_tokens += max(0, n - 1)
        st.win_pred_seconds += gen_s
        if self.style.slots and 0 <= req.slot < len(self.slots):
            slot = self.slots[req.slot]
            # the last sampled token is not yet in the cache
            slot.tokens = (req.prompt + req.generated)[:-1]
            slot.request = None
            slot.last_used = self.clock.now()
            slot.last_task = req.id
        elif not self.style.slots:
            self.radix.append(req.prompt + req.generated)
            self._evict_for(0)
        self.finished.append(req)
        req.events.put_nowait(None)
        req.done.set()
        self._wake.set()

    def gen_throughput(self) -> float:
        """Aggregate decode tokens/s over the last 40 steps (SGLang's gen_throughput)."""
        win = self.stats.decode_window
        if len(win) < 2 or self.clock.now() - win[-1][0] > 30:
            return 0.0
        span = win[-1][0] - win[0][0]
        return sum(n for _, n in list(win)[1:]) / span if span > 0 else 0.0

    def ready(self) -> bool:
        """True once the simulated load phase is over."""
        return self.clock.now() >= self.loaded_at
