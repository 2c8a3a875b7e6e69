"""Performance model and scheduler shared by both simulated engines.

One decode step of the whole batch costs
    (weight bytes on the GPU + KV bytes read on the GPU) / GPU bandwidth
  + (weight bytes on the CPU + KV bytes read on the CPU) / CPU bandwidth
  + fixed overhead + per-sequence overhead x batch size,
and a prefill costs uncached prompt tokens / prefill tokens per second. Slots (llama.cpp)
or max running requests (SGLang) and the KV capacity in tokens decide who runs; the
rest waits in a FIFO queue. Times are simulated seconds; `Clock` maps them to wall time
through `time_scale` so tests can run the same scenario ten times faster.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from exporter.model.ggml_types import GGML_TYPES
from simulator.tokenizer import GENERATION_WORDS, Tokenizer

MIB = 1024 * 1024
# Layers whose routing is drawn each step; the others are taken to touch as many experts.
ROUTING_PROBE_LAYERS = 4
# Bytes per KV element: ggml block bytes / block elements (llama.cpp), SGLang dtypes.
LLAMACPP_KV_BYTES = {name.lower(): size / block for name, block, size in GGML_TYPES.values()}
# The types llama.cpp accepts for -ctk/-ctv.
LLAMACPP_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
SGLANG_KV_BYTES = {"auto": 2.0, "bf16": 2.0, "float16": 2.0, "fp8_e5m2": 1.0, "fp8_e4m3": 1.0}


@dataclass(frozen=True)
class ModelSpec:
    """The simulated model: sizes that drive memory and bandwidth."""

    name: str
    n_params: int
    file_bytes: int
    n_layer: int  # repeating layers; llama.cpp counts one more (the output layer)
    layer_bytes: int
    output_bytes: int
    kv_bytes_per_token: int
    n_ctx_train: int = 131072
    n_embd: int = 5376
    n_vocab: int = 262144
    ftype: str = "Q4_0"
    sglang_weight_bytes: int | None = None  # SGLang serves unquantized weights
    # Mixture of experts: every repeating layer holds `expert_count` routed experts of which
    # each token runs `expert_used`; `routed_layer_bytes` of `layer_bytes` are those experts.
    expert_count: int = 0
    expert_used: int = 0
    routed_layer_bytes: int = 0
    # An untied token embedding: llama.cpp keeps the table in host memory and reads one row
    # per sequence and step. 0: tied (the output projection is the table, in `output_bytes`).
    token_embd_bytes: int = 0
    token_row_bytes: int = 0
    # The file the engine serves: a `llmb-synth-model` shape (like, weight type) written as a
    # header-only GGUF (llama.cpp), and an HF config.json (SGLang), so that readers of
    # `model_path` see this model's real geometry. None: a path that does not exist.
    gguf_like: tuple[str, str] | None = None
    hf_config: Mapping[str, object] | None = None

    @property
    def weights_bytes(self) -> int:
        """Bytes of every weight a decode step may read (the untied embedding table excluded)."""
        return self.n_layer * self.layer_bytes + self.output_bytes

    @property
    def routed_bytes(self) -> int:
        """Bytes of all routed experts (0 for a dense model)."""
        return self.n_layer * self.routed_layer_bytes


@dataclass(frozen=True)
class GpuSpec:
    """The simulated card (what NVML would report)."""

    name: str
    total_bytes: int
    bandwidth: float  # bytes/s
    bus_width: int
    mem_clock_mhz: int
    uuid: str
    reserved_bytes: int = 644939776
    driver_bytes: int = 592 * MIB  # CUDA context of a process
    idle_power_mw: int = 75000
    max_power_mw: int = 600000


@dataclass
class EngineParams:
    """Engine settings (flags) and costs of one simulated server."""

    n_slots: int = 4  # llama.cpp -np / SGLang --max-running-requests
    ctx_total: int = 32768  # llama.cpp -c / SGLang max_total_num_tokens
    context_len: int = 8192  # SGLang context_len (llama.cpp: per-slot n_ctx)
    kv_unified: bool = False
    n_gpu_layers: int = -1  # -1: all
    prefill_tok_s: float = 2100.0
    step_overhead_s: float = 0.0057
    per_seq_overhead_s: float = 0.0017
    cpu_bandwidth: float = 55e9
    cpu_prefill_tok_s: float = 85.0  # prompt tokens/s if every layer ran on the CPU
    compute_buffer_bytes: int = 177 * MIB
    graph_bytes: int = 0
    load_seconds: float = 0.0
    natural_len: tuple[int, int] = (24, 400)  # EOS position range when ignore_eos is false
    new_token_ratio: float = 0.1  # SGLang: share of max_new_tokens reserved at admission
    # MoE: router, top-k, token sort and one grouped matmul per MoE layer and step.
    moe_layer_overhead_s: float = 0.0
    # llama.cpp --n-cpu-moe N: the routed experts of the first N layers stay in host memory.
    n_cpu_moe: int = 0
    # KV cache element types: llama.cpp -ctk/-ctv (ggml type names), SGLang --kv-cache-dtype.
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    kv_cache_dtype: str = "auto"
    # Speculative decoding: a draft model proposes `spec_draft_max` tokens per step, each
    # accepted with `spec_accept_p` given the previous one was; the target verifies all of
    # them in one forward. llama.cpp: -md + --spec-type draft-simple; SGLang: EAGLE.
    spec_draft_max: int = 0
    spec_accept_p: float = 0.0
    draft_bytes: int = 0  # draft weights read per draft step
    draft_kv_bytes_per_token: int = 0  # the draft's own KV cache (llama.cpp -md)
    draft_step_overhead_s: float = 0.0
    spec_seed: int = 0

    def slot_ctx(self, n_ctx_train: int) -> int:
        """Per-slot context as llama.cpp computes it (pool when unified, else split + 256 pad)."""
        if self.kv_unified:
            return min(self.ctx_total, n_ctx_train)
        per = self.ctx_total // max(1, self.n_slots)
        return min(max(256, per - per % 256), n_ctx_train)


class Clock:
    """Simulated seconds; wall time = simulated time x `scale`."""

    def __init__(self, scale: float = 1.0):
        if scale <= 0:
            raise ValueError("time scale must be positive")
        self.scale = scale
        self._wall0 = time.monotonic()
        self.unix0 = time.time()

    def now(self) -> float:
        """Simulated seconds since start."""
        return (time.monotonic() - self._wall0) / self.scale

    def unix(self) -> float:
        """Simulated Unix time."""
        return self.unix0 + self.now()

    async def sleep(self, seconds: float) -> None:
        """Let `seconds` of simulated time pass."""
        await asyncio.sleep(max(0.0, seconds) * self.scale)


class RequestError(Exception):
    """A request the engine refuses (HTTP 400)."""


@dataclass
class Request:
    """One generation request moving through the scheduler."""

    id: int
    prompt: list[int]
    max_tokens: int  # -1: until EOS or context end
    ignore_eos: bool
    rng: random.Random
    natural_len: int
    stream: bool = False
    arrival: float = 0.0
    admitted: float | None = None
    prompt_done: float | None = None
    last_token: float | None = None
    slot: int = -1
    cached: int = 0
    prefilled: bool = False
    generated: list[int] = field(default_factory=list)
    truncated: bool = False
    finish: str | None = None  # "length" | "stop"
    retractions: int = 0
    observed: bool = False  # per-request metrics recorded (SGLang)
    recompute: int = 0  # generated tokens to recompute after a retraction
    draft_n: int = 0  # speculative decoding: tokens drafted for this request
    draft_accepted: int = 0
    n_drafts: int = 0  # verification steps with a draft
    events: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def n_tokens(self) -> int:
        """Tokens this sequence holds in the KV cache."""
        return len(self.prompt) + len(self.generated)

    @property
    def ttft(self) -> float | None:
        """Simulated seconds from arrival to the first token."""
        return None if self.prompt_done is None else self.prompt_done - self.arrival

    @property
    def uncached(self) -> int:
        """Prompt tokens that must be computed."""
        return len(self.prompt) - self.cached + self.recompute


@dataclass
class Slot:
    """A llama.cpp slot, keeping the tokens of its last request as prompt cache."""

    id: int
    tokens: list[int] = field(default_factory=list)
    request: Request | None = None
    last_task: int | None = None
    last_params: dict[str, object] | None = None
    last_used: float = -1.0


@dataclass
class Stats:
    """Cumulative counters both engines render in their own way."""

    prompt_tokens: int = 0  # computed (uncached)
    prompt_cached: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    n_decode: int = 0
    busy_slot_sum: int = 0
    n_tokens_max: int = 0
    # windows reset by the llama.cpp /metrics scrape
    win_prompt_tokens: int = 0
    win_prompt_seconds: float = 0.0
    win_pred_tokens: int = 0
    win_pred_seconds: float = 0.0
    decode_tokens: int = 0
    retracted: int = 0
    retracted_in: int = 0
    retracted_out: int = 0
    last_cache_hit_rate: float = 0.0
    # speculative decoding (llama.cpp spec_decode_* counters)
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_drafts: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    decode_window: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=40))


def lcp(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Engine:
    """The scheduler: admits, prefills and decodes requests on simulated time."""

    def __init__(
        self,
        kind: str,
        model: ModelSpec,
        gpu: GpuSpec,
        params: EngineParams,
        tokenizer: Tokenizer,
        clock: Clock,
        log: Callable[[str, str], None] | None = None,
    ):
        self.kind = kind
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

    # -- memory ---------------------------------------------------------------------------
    @property
    def n_layers_total(self) -> int:
        """Layers as llama.cpp counts them (repeating + output)."""
        return self.model.n_layer + 1

    @property
    def gpu_layers(self) -> int:
        """Layers offloaded to the GPU."""
        ngl = self.params.n_gpu_layers
        return self.n_layers_total if ngl < 0 else min(ngl, self.n_layers_total)

    @property
    def weights_total(self) -> int:
        """Weight bytes of the served model."""
        if self.kind == "sglang" and self.model.sglang_weight_bytes:
            return self.model.sglang_weight_bytes
        return self.model.weights_bytes

    @property
    def weights_gpu(self) -> int:
        """Weight bytes resident on the GPU (output layer goes first, as llama.cpp does)."""
        return self._layers_gpu_bytes() - self.host_expert_bytes

    def _layers_gpu_bytes(self) -> int:
        if self.gpu_layers >= self.n_layers_total:
            return self.weights_total
        if self.gpu_layers <= 0:
            return 0
        share = (self.gpu_layers - 1) / self.model.n_layer
        scale = self.weights_total / self.model.weights_bytes
        return int(
            (self.model.output_bytes + share * self.model.n_layer * self.model.layer_bytes) * scale
        )

    @property
    def host_expert_layers(self) -> int:
        """Offloaded layers whose routed experts stay in host memory (llama.cpp --n-cpu-moe)."""
        if self.kind != "llamacpp" or not self.model.expert_count:
            return 0
        first_gpu_layer = self.model.n_layer - self.n_layer_gpu()
        return max(0, min(self.params.n_cpu_moe, self.model.n_layer) - first_gpu_layer)

    @property
    def host_expert_bytes(self) -> int:
        """Bytes of the routed experts kept in host memory by --n-cpu-moe."""
        return self.host_expert_layers * self.model.routed_layer_bytes

    @property
    def weights_cpu(self) -> int:
        """Weight bytes in host memory (whole layers under -ngl, experts under --n-cpu-moe)."""
        return self.weights_total - self.weights_gpu

    @property
    def kv_gpu_share(self) -> float:
        """Share of the KV cache that lives on the GPU (follows the repeating layers)."""
        if self.gpu_layers >= self.n_layers_total:
            return 1.0
        return max(0, self.gpu_layers - 1) / self.model.n_layer

    @property
    def kv_type_bytes(self) -> tuple[float, float]:
        """Bytes per K and per V element of the cache (the model's figure is for 16-bit)."""
        p = self.params
        if self.kind == "sglang":
            size = SGLANG_KV_BYTES[p.kv_cache_dtype]
            return size, size
        return LLAMACPP_KV_BYTES[p.cache_type_k], LLAMACPP_KV_BYTES[p.cache_type_v]

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token of context takes in this engine's cache element types."""
        k, v = self.kv_type_bytes
        return self.model.kv_bytes_per_token * (k + v) / 4.0

    @property
    def kv_pool_bytes(self) -> int:
        """KV buffer allocated at start for the whole pool.

        SGLang allocates one page more than `max_total_num_tokens` (a dummy slot for padded
        tokens; page size 1 here)."""
        slots = self.params.ctx_total + (1 if self.kind == "sglang" else 0)
        return round(slots * self.kv_bytes_per_token)

    def process_gpu_bytes(self) -> int:
        """What NVML would report as this process's GPU memory."""
        if self.clock.now() < self.loaded_at * 0.5:
            return self.gpu.driver_bytes  # still mapping the weights
        return int(
            self.gpu.driver_bytes
            + self.weights_gpu
            + self.kv_pool_bytes * self.kv_gpu_share
            + self.params.compute_buffer_bytes
            + self.params.graph_bytes
            + self.params.draft_bytes
            + self.params.ctx_total * self.params.draft_kv_bytes_per_token
        )

    # -- KV accounting ----------------------------------------------------------------------
    def kv_used(self) -> int:
        """Tokens held by running sequences."""
        return sum(r.n_tokens for r in self.running)

    def kv_cached_idle(self) -> int:
        """Tokens held as prefix cache but evictable (idle slots / radix tree)."""
        if self.kind == "sglang":
            return sum(len(t) for t in self.radix)
        return sum(len(s.tokens) for s in self.slots if s.request is None)

    def _evict_for(self, need: int) -> None:
        """Drop cached prefixes until `need` tokens fit in the pool."""
        cap = self.params.ctx_total
        if self.kind == "sglang":
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

    # -- requests -----------------------------------------------------------------------------
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
        limit = self.n_ctx_slot if self.kind == "llamacpp" else self.params.context_len
        if len(prompt) >= limit:
            raise RequestError(
                f"the request exceeds the available context size ({len(prompt)} >= {limit} tokens)"
            )
        if self.kind == "sglang" and len(prompt) > self.params.ctx_total:
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

    # -- scheduling ------------------------------------------------------------------------
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
            if self.kind == "llamacpp":
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

    def prefill_seconds(self, tokens: int) -> float:
        """Time to compute `tokens` prompt tokens (CPU-resident layers are compute bound)."""
        cpu_share = 1.0 - self.kv_gpu_share
        return (
            tokens / self.params.prefill_tok_s + tokens * cpu_share / self.params.cpu_prefill_tok_s
        )

    def routed_share(self, tokens: int) -> float:
        """Share of the routed experts a forward over `tokens` tokens reads.

        Drawn as the router picks: every token runs `expert_used` distinct experts, chosen
        uniformly; a layer reads each expert any of its tokens picked once.
        """
        m = self.model
        if not m.expert_count or tokens <= 0:
            return 0.0
        experts = range(m.expert_count)
        layers = min(m.n_layer, ROUTING_PROBE_LAYERS)
        touched = 0
        for _ in range(layers):
            seen: set[int] = set()
            for _ in range(tokens):
                seen.update(self._route_rng.sample(experts, m.expert_used))
                if len(seen) == m.expert_count:
                    break
            touched += len(seen)
        return touched / (layers * m.expert_count)

    def _weights_read(self, tokens: int, n_seq: int) -> tuple[float, float]:
        """Weight bytes one forward reads from GPU and from host memory."""
        m, scale = self.model, self.weights_total / self.model.weights_bytes
        share = self.routed_share(tokens)
        self.last_routed_share = share
        gpu_layers = self.n_layer_gpu() - self.host_expert_layers  # layers with experts on GPU
        unread = m.routed_layer_bytes * scale * (1.0 - share)
        gpu = self.weights_gpu - unread * gpu_layers
        cpu = self.weights_cpu - unread * (m.n_layer - gpu_layers) + n_seq * m.token_row_bytes
        return gpu, cpu

    def n_layer_gpu(self) -> int:
        """Repeating layers on the GPU (the output layer is offloaded first)."""
        if self.gpu_layers >= self.n_layers_total:
            return self.model.n_layer
        return max(0, self.gpu_layers - 1)

    def decode_seconds(self, batch: list[Request]) -> float:
        """Time of one decode step over `batch` (with speculative decoding: draft + verify)."""
        if not batch:
            return 0.0
        p = self.params
        width = 1 + p.spec_draft_max  # tokens per sequence the target computes this step
        kv_bytes = sum(r.n_tokens for r in batch) * self.kv_bytes_per_token
        share = self.kv_gpu_share
        weights_gpu, weights_cpu = self._weights_read(len(batch) * width, len(batch))
        gpu_bytes = weights_gpu + kv_bytes * share
        cpu_bytes = weights_cpu + kv_bytes * (1 - share)
        memory_s = gpu_bytes / self.gpu.bandwidth
        moe_s = p.moe_layer_overhead_s * self.model.n_layer if self.model.expert_count else 0.0
        draft_s = p.spec_draft_max * (p.draft_bytes / self.gpu.bandwidth + p.draft_step_overhead_s)
        total = (
            memory_s
            + cpu_bytes / p.cpu_bandwidth
            + moe_s
            + draft_s
            + p.step_overhead_s
            + p.per_seq_overhead_s * len(batch)
        )
        self.utilization = memory_s / total
        return total

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
        if self.kind == "sglang" and decode:
            self._retract_if_full(decode)
            decode = [r for r in self.running if r.prefilled]
        prefill_tokens = sum(r.uncached for r in new)
        t_prefill = self.prefill_seconds(prefill_tokens) if new else 0.0
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
        elif self.kind == "llamacpp" and req.n_tokens >= self.n_ctx_slot:
            req.truncated = True
            self._finish(req, "length")
        elif self.kind == "sglang" and req.n_tokens >= self.params.context_len:
            self._finish(req, "length")
        elif (
            self.kind == "llamacpp"
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
        if self.kind == "llamacpp" and 0 <= req.slot < len(self.slots):
            slot = self.slots[req.slot]
            # the last sampled token is not yet in the cache
            slot.tokens = (req.prompt + req.generated)[:-1]
            slot.request = None
            slot.last_used = self.clock.now()
            slot.last_task = req.id
        elif self.kind == "sglang":
            self.radix.append(req.prompt + req.generated)
            self._evict_for(0)
        self.finished.append(req)
        req.events.put_nowait(None)
        req.done.set()
        self._wake.set()

    # -- derived numbers ------------------------------------------------------------------------
    def gen_throughput(self) -> float:
        """Aggregate decode tokens/s over the last 40 steps (SGLang's gen_throughput)."""
        win = self.stats.decode_window
        if len(win) < 2 or self.clock.now() - win[-1][0] > 30:
            return 0.0
        span = win[-1][0] - win[0][0]
        return sum(n for _, n in list(win)[1:]) / span if span > 0 else 0.0

    def tokens_per_step(self) -> float:
        """Expected tokens one decode step gives a sequence (1 + accepted drafts)."""
        p = self.params
        return sum(p.spec_accept_p**i for i in range(p.spec_draft_max + 1))

    def per_seq_tok_s(self, batch: int) -> float:
        """Steady-state decode speed of one sequence at `batch` (documentation, tests)."""
        fake = [Request(-1, [0] * 512, 0, True, random.Random(0), 0) for _ in range(batch)]
        util, share = self.utilization, self.last_routed_share
        speed = self.tokens_per_step() / self.decode_seconds(fake)
        self.utilization, self.last_routed_share = util, share
        return speed

    def ready(self) -> bool:
        """True once the simulated load phase is over."""
        return self.clock.now() >= self.loaded_at
