"""Scenario presets: one model, one card and the engine flags for each bottleneck.

docs/simulators.md lists the numbers each preset should produce; tests/test_sim_scenarios.py
checks the signatures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simulator.model import MIB, EngineParams, GpuSpec, ModelSpec

GIB = 1024 * MIB

# Gemma 3 27B shapes in Q4_0, sizes from the H200 capture's -lv 4 log (run2 -ngl 30):
# 29 layers + output = 7181.51 MiB on CUDA0, 33 layers + token embedding = 8067.74 MiB on CPU.
GEMMA3_27B_Q4 = ModelSpec(
    name="/models/gemma3-27b-synthetic-q4_0.gguf",
    n_params=27009002240,
    file_bytes=15203778848,
    n_layer=62,
    layer_bytes=int(221.5575 * MIB),
    output_bytes=int(756.34 * MIB),
    kv_bytes_per_token=1264 * MIB // 8192,  # "context" 1264 MiB at -c 8192
    n_ctx_train=131072,
    n_embd=5376,
    ftype="Q4_0",
    sglang_weight_bytes=int(51.12 * GIB),  # bf16, as SGLang reports it
)

MID_8B = ModelSpec(
    name="/models/llmb-sim-8b-q4_k_m.gguf",
    n_params=8030261248,
    file_bytes=4920733696,
    n_layer=32,
    layer_bytes=140 * MIB,
    output_bytes=400 * MIB,
    kv_bytes_per_token=128 * 1024,
    n_ctx_train=131072,
    n_embd=4096,
    n_vocab=128256,
    ftype="Q4_K - Medium",
)

BIG_32B = ModelSpec(
    name="/models/llmb-sim-32b-q8_0.gguf",
    n_params=32763876352,
    file_bytes=34820000000,
    n_layer=64,
    layer_bytes=512 * MIB,
    output_bytes=1 * GIB,
    kv_bytes_per_token=256 * 1024,
    n_ctx_train=131072,
    n_embd=5120,
    n_vocab=152064,
    ftype="Q8_0",
)

H200 = GpuSpec(
    name="NVIDIA H200",
    total_bytes=150754820096,
    bandwidth=4.8e12,
    bus_width=6016,
    mem_clock_mhz=3201,
    uuid="GPU-5e1a0000-11b0-4000-8000-000000000200",
    idle_power_mw=75000,
    max_power_mw=700000,
)

L40S = GpuSpec(
    name="NVIDIA L40S",
    total_bytes=48305799168,
    bandwidth=864e9,
    bus_width=384,
    mem_clock_mhz=9001,
    uuid="GPU-5e1a0000-11b0-4000-8000-00000000040a",
    reserved_bytes=515899392,
    idle_power_mw=35000,
    max_power_mw=350000,
)

# The seed's case: a 72 GB card whose memory bandwidth is 1.344e12 B/s (512-bit bus).
RTX_PRO_5000 = GpuSpec(
    name="NVIDIA RTX PRO 5000 Blackwell",
    total_bytes=72 * GIB,
    bandwidth=1.344e12,
    bus_width=512,
    mem_clock_mhz=10500,
    uuid="GPU-5e1a0000-11b0-4000-8000-000000005000",
    reserved_bytes=515899392,
    idle_power_mw=30000,
    max_power_mw=300000,
)


@dataclass(frozen=True)
class Scenario:
    """A preset: model, card, and engine parameters for each engine kind."""

    name: str
    description: str
    model: ModelSpec
    gpu: GpuSpec
    llamacpp: EngineParams
    sglang: EngineParams

    def params(self, kind: str) -> EngineParams:
        """Engine parameters for `kind` (a fresh copy, safe to modify)."""
        return replace(self.llamacpp if kind == "llamacpp" else self.sglang)


def _fast(**kw: Any) -> EngineParams:
    """Engine costs of the generic presets (smaller per-step overheads than the H200 build)."""
    return EngineParams(
        step_overhead_s=0.003, per_seq_overhead_s=0.0005, prefill_tok_s=8000.0, **kw
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "healthy",
            "8B Q4 on an L40S: every layer on the GPU, room in the KV cache and in the slots.",
            MID_8B,
            L40S,
            _fast(n_slots=4, ctx_total=32768),
            _fast(n_slots=32, ctx_total=200000, context_len=8192),
        ),
        Scenario(
            "weights_not_resident",
            "Same model, only 10 of 33 layers on the GPU: host-memory reads dominate decode.",
            MID_8B,
            L40S,
            _fast(n_slots=4, ctx_total=16384, n_gpu_layers=10),
            _fast(n_slots=32, ctx_total=40000, n_gpu_layers=10),
        ),
        Scenario(
            "kv_saturated",
            "Small KV pool: running sequences fill it and new requests wait for space.",
            MID_8B,
            L40S,
            _fast(n_slots=4, ctx_total=4096, kv_unified=True),
            _fast(n_slots=64, ctx_total=8192, context_len=4096),
        ),
        Scenario(
            "scheduling_bound",
            "Two slots / two running requests with a large, mostly empty KV cache.",
            MID_8B,
            L40S,
            _fast(n_slots=2, ctx_total=65536),
            _fast(n_slots=2, ctx_total=200000, context_len=8192),
        ),
        Scenario(
            "decode_bound",
            "32B Q8 on an L40S: fits, no queue, but each step reads 35 GB at 864 GB/s.",
            BIG_32B,
            L40S,
            _fast(n_slots=4, ctx_total=16384),
            _fast(n_slots=32, ctx_total=16384, context_len=8192),
        ),
        Scenario(
            "h200-gemma3-27b",
            "Gemma 3 27B shapes, Q4_0, on an H200: numbers of the real captures "
            "(use -np/-c/-ngl/--kv-unified as in the capture runs).",
            GEMMA3_27B_Q4,
            H200,
            EngineParams(n_slots=1, ctx_total=8192, compute_buffer_bytes=177 * MIB),
            EngineParams(
                n_slots=48,
                ctx_total=463552,
                context_len=8192,
                graph_bytes=int(0.83 * GIB),
                compute_buffer_bytes=0,
            ),
        ),
        Scenario(
            "rtx-pro-5000-27b",
            "A 27B model on a 72 GB card at 1.344e12 B/s (the seed's case).",
            GEMMA3_27B_Q4,
            RTX_PRO_5000,
            EngineParams(n_slots=4, ctx_total=32768, prefill_tok_s=1500.0),
            EngineParams(
                n_slots=48,
                ctx_total=61800,
                context_len=8192,
                prefill_tok_s=1500.0,
                graph_bytes=int(0.5 * GIB),
                compute_buffer_bytes=0,
            ),
        ),
    )
}


def get(name: str) -> Scenario:
    """Return the preset called `name` or raise KeyError listing the known ones."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})") from None
