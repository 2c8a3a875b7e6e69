"""What the simulators' performance model works on, shared by both engines.

The model, card and engine settings (`ModelSpec`, `GpuSpec`, `EngineParams`), simulated time
(`Clock`), and the state of requests, slots and counters. The model itself is `memory` (where
the bytes are), `costs` (what a step costs) and `engine` (the scheduler). Times are simulated
seconds; `Clock` maps them to wall time through `time_scale` so tests can run the same scenario
ten times faster.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from model.ggml_types import GGML_TYPES

MIB = 1024 * 1024
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
    # The card's own state under load (issue 27): SM clock and its maximum, the NVML clock
    # event reasons (bitmask) and the temperature. A busy card below its maximum SM clock
    # runs the engine's compute (overheads, prefill) that much slower.
    max_sm_clock_mhz: int = 1980
    busy_sm_clock_mhz: int = 1980
    busy_clock_reasons: int = 0
    busy_temp_c: int = 53

    @property
    def compute_slowdown(self) -> float:
        """How much longer compute takes under load than at the maximum SM clock."""
        return self.max_sm_clock_mhz / self.busy_sm_clock_mhz


@dataclass(frozen=True)
class KvStyle:
    """How an engine holds its KV cache and weights: the switches of the shared model
    (engine.py, memory.py) that each kind's simulator class sets (`SimBase.style`)."""

    # Each request takes a slot with its own context (n_ctx / slots) whose tokens stay as its
    # prompt cache (llama.cpp); else one token pool with a radix prefix cache that retracts
    # running requests when full and rejects a prompt larger than the pool (SGLang).
    slots: bool
    # K and V cache types set apart (-ctk/-ctv), else one --kv-cache-dtype.
    split_kv_types: bool = False
    # Routed experts of the first offloaded layers may stay in host memory (--n-cpu-moe).
    experts_on_host: bool = False
    # The weight bytes of the HF checkpoint where the model has them (SGLang's figure).
    checkpoint_weights: bool = False
    # One KV page more than the pool's tokens (SGLang's padding slot).
    padding_page: bool = False


@dataclass
class EngineParams:
    """Engine settings (flags) and costs of one simulated server."""

    n_slots: int = 4  # llama.cpp -np / SGLang --max-running-requests
    ctx_total: int = 32768  # llama.cpp -c / SGLang max_total_num_tokens
    context_len: int = 8192  # SGLang context_len (llama.cpp: per-slot n_ctx)
    kv_unified: bool = False
    n_gpu_layers: int = -1  # -1: all
    prefill_tok_s: float = 2100.0
    # Prompts computed at this many FLOP/s (the model's FLOPs per prompt token at the
    # prompt's length, model/flops.py): a share of the card's peak; None: `prefill_tok_s`.
    prefill_flops_per_s: float | None = None
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

    # (time, tokens emitted) of the last decode steps (SGLang's gen_throughput)
    decode_window: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=40))
    # accepted draft tokens per draft position (llama.cpp spec_decode_..._per_pos_total)
    spec_accepted_per_pos: list[int] = field(default_factory=list)
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


def lcp(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
