"""Scenario presets: one model, one card and the engine flags for each bottleneck.

docs/simulators.md lists the numbers each preset should produce;
tests/integration/test_sim_scenarios.py checks the signatures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simulator.model import LLAMACPP_KV_BYTES, MIB, EngineParams, GpuSpec, ModelSpec

GIB = 1024 * MIB

# fmt: off
# -- models ------------------------------------------------------------------------------------
# Keywords are packed a topic a line: size, layers, KV, context and vocabulary, weight format.

# Gemma 3 27B shapes in Q4_0, sizes from the H200 capture's -lv 4 log (run2 -ngl 30):
# 29 layers + output = 7181.51 MiB on CUDA0, 33 layers + token embedding = 8067.74 MiB on CPU.
GEMMA3_27B_Q4 = ModelSpec(
    name="/models/gemma3-27b-synthetic-q4_0.gguf", n_params=27009002240, file_bytes=15203778848,
    n_layer=62, layer_bytes=int(221.5575 * MIB), output_bytes=int(756.34 * MIB),
    kv_bytes_per_token=1264 * MIB // 8192,  # "context" 1264 MiB at -c 8192
    n_ctx_train=131072, n_embd=5376, ftype="Q4_0",
    sglang_weight_bytes=int(51.12 * GIB),  # bf16, as SGLang reports it
)
MID_8B = ModelSpec(
    name="/models/llmb-sim-8b-q4_k_m.gguf", n_params=8030261248, file_bytes=4920733696,
    n_layer=32, layer_bytes=140 * MIB, output_bytes=400 * MIB, kv_bytes_per_token=128 * 1024,
    n_ctx_train=131072, n_embd=4096, n_vocab=128256, ftype="Q4_K - Medium",
)
BIG_32B = ModelSpec(
    name="/models/llmb-sim-32b-q8_0.gguf", n_params=32763876352, file_bytes=34820000000,
    n_layer=64, layer_bytes=512 * MIB, output_bytes=1 * GIB, kv_bytes_per_token=256 * 1024,
    n_ctx_train=131072, n_embd=5120, n_vocab=152064, ftype="Q8_0",
)
# fmt: on

# Shapes written by `llmb-synth-model` (numbers from its plan;
# tests/integration/test_sim_moe.py checks them against tools.synth_model): per-layer
# bytes, routed experts, output layer, embedding table.
QWEN3_VOCAB = 151936
QWEN3_HEAD_DIM = 128
# What every Qwen3 config.json says (the files list keys in order).
_QWEN3_HF: dict[str, object] = {
    "attention_bias": False,
    "head_dim": QWEN3_HEAD_DIM,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": QWEN3_VOCAB,
}
# fmt: off
QWEN3_30B_A3B_HF: dict[str, object] = dict(sorted({
    **_QWEN3_HF, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "bos_token_id": 151643, "eos_token_id": 151645, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 48,
    "max_window_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "rope_scaling": None,
}.items()))
QWEN3_DENSE_HF: dict[str, object] = dict(sorted({
    **_QWEN3_HF, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "num_key_value_heads": 8,
}.items()))
# fmt: on


def _qwen3(like: str, wtype: str, hf: dict[str, object], **sizes: Any) -> ModelSpec:
    """A Qwen3 shape as `llmb-synth-model --like LIKE --type WTYPE` writes it.

    `sizes` are the plan's numbers (n_params, file_bytes, layer_bytes, output_bytes and the MoE
    fields); the rest follows from the HF config: KV bytes per token (layers x KV heads x head
    dim x K+V x 16 bits), SGLang's bf16 weights a step may read (all but the embedding table,
    which it reads by rows), the untied embedding table (the output layer less its f32 norm)
    and one embedding row in the weight type.
    """
    n_layer, n_embd = int(hf["num_hidden_layers"]), int(hf["hidden_size"])  # type: ignore[call-overload]
    kv_heads = int(hf["num_key_value_heads"])  # type: ignore[call-overload]
    return ModelSpec(
        name=f"/models/{like}-synthetic-{wtype}.gguf",
        n_layer=n_layer,
        kv_bytes_per_token=n_layer * kv_heads * QWEN3_HEAD_DIM * 2 * 2,
        n_ctx_train=int(hf["max_position_embeddings"]),  # type: ignore[call-overload]
        n_embd=n_embd,
        n_vocab=QWEN3_VOCAB,
        ftype=wtype.upper(),
        sglang_weight_bytes=2 * (sizes["n_params"] - QWEN3_VOCAB * n_embd),
        token_embd_bytes=sizes["output_bytes"] - 4 * n_embd,
        token_row_bytes=int(n_embd * LLAMACPP_KV_BYTES[wtype]),
        gguf_like=(like, wtype),
        hf_config=hf,
        **sizes,
    )


# fmt: off
QWEN3_30B_A3B_Q8 = _qwen3(
    "qwen3-30b-a3b", "q8_0", QWEN3_30B_A3B_HF,
    n_params=30532122624, file_bytes=32477962240,  # tensor data, llama-server's `size`
    layer_bytes=662848512, output_bytes=330620928,
    expert_count=128, expert_used=8, routed_layer_bytes=641728512,
)
QWEN3_8B_Q4 = _qwen3(
    "qwen3-8b", "q4_0",
    {**QWEN3_DENSE_HF, "hidden_size": 4096, "intermediate_size": 12288,
     "num_attention_heads": 32, "num_hidden_layers": 36, "max_window_layers": 36},
    n_params=8190735360, file_bytes=4608348160, layer_bytes=108561408, output_bytes=350076928,
)
QWEN3_32B_Q8 = _qwen3(
    "qwen3-32b", "q8_0",
    {**QWEN3_DENSE_HF, "hidden_size": 5120, "intermediate_size": 25600,
     "num_attention_heads": 64, "num_hidden_layers": 64, "max_window_layers": 64},
    n_params=32762123264, file_bytes=34811744256, layer_bytes=518104064, output_bytes=826552320,
)
# fmt: on
# The draft: Qwen3-0.6B in Q8_0 (`llmb-synth-model --like qwen3-0.6b --type q8_0`): 0.60 B
# parameters, the tied 151936 x 1024 embedding read every step as the output projection.
QWEN3_06B_Q8_BYTES = 633_495_552
QWEN3_06B_KV_BYTES_PER_TOKEN = 28 * 8 * 128 * 2 * 2
# SGLang's EAGLE draft for it: one bf16 decoder layer of the 32B (0.6 GB) and its fc; the LM
# head is the target's.
EAGLE_32B_BYTES = 700_000_000

# -- cards -------------------------------------------------------------------------------------
# fmt: off
H200 = GpuSpec(
    name="NVIDIA H200", total_bytes=150754820096, bandwidth=4.8e12, bus_width=6016,
    mem_clock_mhz=3201, uuid="GPU-5e1a0000-11b0-4000-8000-000000000200",
    idle_power_mw=75000, max_power_mw=700000,
)
L40S = GpuSpec(
    name="NVIDIA L40S", total_bytes=48305799168, bandwidth=864e9, bus_width=384,
    mem_clock_mhz=9001, uuid="GPU-5e1a0000-11b0-4000-8000-00000000040a",
    reserved_bytes=515899392, idle_power_mw=35000, max_power_mw=350000,
)
# The seed's case: a 72 GB card whose memory bandwidth is 1.344e12 B/s (512-bit bus).
RTX_PRO_5000 = GpuSpec(
    name="NVIDIA RTX PRO 5000 Blackwell", total_bytes=72 * GIB, bandwidth=1.344e12, bus_width=512,
    mem_clock_mhz=10500, uuid="GPU-5e1a0000-11b0-4000-8000-000000005000",
    reserved_bytes=515899392, idle_power_mw=30000, max_power_mw=300000,
)
# An H100 SXM held at its power limit under load (issue 27; the InferenceX H200 run of
# SemiAnalysisAI/InferenceX#870 met the thermal kind): NVML reports SW power cap and the SM
# clock sits at 1155 of 1980 MHz while the memory clock keeps its maximum.
H100_POWER_CAPPED = GpuSpec(
    name="NVIDIA H100 80GB HBM3", total_bytes=85520809984, bandwidth=3.35e12, bus_width=5120,
    mem_clock_mhz=2619, uuid="GPU-5e1a0000-11b0-4000-8000-000000000100",
    idle_power_mw=70000, max_power_mw=700000, busy_sm_clock_mhz=1155,
    busy_clock_reasons=0x4, busy_temp_c=62,
)
# fmt: on


@dataclass(frozen=True)
class Scenario:
    """A preset: model, card, and engine parameters for each engine kind (one field per
    simulated kind, named as the kind)."""

    name: str
    description: str
    model: ModelSpec
    gpu: GpuSpec
    llamacpp: EngineParams
    sglang: EngineParams

    def params(self, kind: str) -> EngineParams:
        """Engine parameters for `kind` (a fresh copy, safe to modify)."""
        params = getattr(self, kind, None)
        if not isinstance(params, EngineParams):
            raise KeyError(f"scenario {self.name!r} has no parameters for kind {kind!r}")
        return replace(params)


def _fast(**kw: Any) -> EngineParams:
    """Engine costs of the generic presets (smaller per-step overheads than the H200 build)."""
    return EngineParams(
        step_overhead_s=0.003, per_seq_overhead_s=0.0005, prefill_tok_s=8000.0, **kw
    )


def _sglang(**kw: Any) -> EngineParams:
    """SGLang of the card presets: no llama.cpp compute buffer (its graphs are `graph_bytes`)."""
    return EngineParams(compute_buffer_bytes=0, **kw)


def _moe(step_s: float, per_seq_s: float, layer_s: float, prefill_tok_s: float) -> dict[str, Any]:
    """Costs of the MoE presets: per step, per sequence, per MoE layer and step; prefill speed."""
    return {
        "step_overhead_s": step_s,
        "per_seq_overhead_s": per_seq_s,
        "moe_layer_overhead_s": layer_s,
        "prefill_tok_s": prefill_tok_s,
    }


# -- prefill presets (issue 27) ---------------------------------------------------------------
# Qwen3-8B shapes on an H200 (989.5 TFLOP/s dense BF16): prompts computed at a share of the
# peak (the model's FLOPs per prompt token, model/flops.py), decode far below its roofline
# (the H200 build's per-step overheads). Loads: simulator/demo.py PREFILL_LOADS.
H200_BF16_FLOPS = 989.5e12


def _prefill(share: float, slots: int) -> tuple[EngineParams, EngineParams]:
    """llama.cpp and SGLang costs of a prefill preset: prompts at `share` of the BF16 peak."""
    costs = {"n_slots": slots, "ctx_total": 65536, "context_len": 32768,
             "prefill_flops_per_s": share * H200_BF16_FLOPS}  # fmt: skip
    return EngineParams(**costs), _sglang(**costs)  # type: ignore[arg-type]


PREFILL_SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "prefill_at_card_limit",
            "Qwen3-8B shapes, Q4_0, on an H200, one long prompt at a time computed at 70 % of "
            "the card's dense BF16 peak: the card is the limit for prompts.",
            QWEN3_8B_Q4,
            H200,
            *_prefill(0.7, 1),
        ),
        Scenario(
            "ttft_waiting",
            "The same, one slot (llama.cpp -np 1, SGLang --max-running-requests 1) and four "
            "clients with long prompts: the time to the first token is mostly waiting.",
            QWEN3_8B_Q4,
            H200,
            *_prefill(0.7, 1),
        ),
        Scenario(
            "prefill_below_limit",
            "The H200 case of issue 27: two 8192-token prompts at a time computed at 15 % of "
            "the card's peak take most of each request: prefill, not decode, sets the speed.",
            QWEN3_8B_Q4,
            H200,
            *_prefill(0.15, 2),
        ),
    )
}

# -- presets -----------------------------------------------------------------------------------
# The generic presets: a made-up 8B (decode_at_card_limit: 32B) on an L40S with `_fast` costs.
# fmt: off
_GENERIC_MODEL = {"healthy": MID_8B, "weights_not_resident": MID_8B, "kv_saturated": MID_8B,
                  "scheduling_bound": MID_8B, "decode_at_card_limit": BIG_32B}
_GENERIC_ABOUT = {
    "healthy":
        "8B Q4 on an L40S: every layer on the GPU, room in the KV cache and in the slots.",
    "weights_not_resident":
        "Same model, only 10 of 33 layers on the GPU: host-memory reads dominate decode.",
    "kv_saturated": "Small KV pool: running sequences fill it and new requests wait for space.",
    "scheduling_bound": "Two slots / two running requests with a large, mostly empty KV cache.",
    "decode_at_card_limit": "32B Q8 on an L40S: fits, no queue; each step reads 35 GB at 864 GB/s.",
}
_GENERIC_LLAMACPP = {
    "healthy": _fast(n_slots=4, ctx_total=32768),
    "weights_not_resident": _fast(n_slots=4, ctx_total=16384, n_gpu_layers=10),
    "kv_saturated": _fast(n_slots=4, ctx_total=4096, kv_unified=True),
    "scheduling_bound": _fast(n_slots=2, ctx_total=65536),
    "decode_at_card_limit": _fast(n_slots=4, ctx_total=16384),
}
_GENERIC_SGLANG = {
    "healthy": _fast(n_slots=32, ctx_total=200000, context_len=8192),
    "weights_not_resident": _fast(n_slots=32, ctx_total=40000, n_gpu_layers=10),
    "kv_saturated": _fast(n_slots=64, ctx_total=8192, context_len=4096),
    "scheduling_bound": _fast(n_slots=2, ctx_total=200000, context_len=8192),
    "decode_at_card_limit": _fast(n_slots=32, ctx_total=16384, context_len=8192),
}
# The card presets: a real shape on a real card. Each: name, description, model, card,
# llama.cpp parameters, SGLang parameters.
SCENARIOS: dict[str, Scenario] = {
    **{
        name: Scenario(name, _GENERIC_ABOUT[name], model, L40S, _GENERIC_LLAMACPP[name],
                       _GENERIC_SGLANG[name])
        for name, model in _GENERIC_MODEL.items()
    },
    **{s.name: s for s in (
        Scenario(
            "h200-gemma3-27b",
            "Gemma 3 27B shapes, Q4_0, on an H200: numbers of the real captures "
            "(use -np/-c/-ngl/--kv-unified as in the capture runs).",
            GEMMA3_27B_Q4, H200,
            EngineParams(n_slots=1, ctx_total=8192, compute_buffer_bytes=177 * MIB),
            _sglang(n_slots=48, ctx_total=463552, context_len=8192, graph_bytes=int(0.83 * GIB)),
        ),
        Scenario(
            "rtx-pro-5000-27b",
            "A 27B model on a 72 GB card at 1.344e12 B/s (the seed's case).",
            GEMMA3_27B_Q4, RTX_PRO_5000,
            EngineParams(n_slots=4, ctx_total=32768, prefill_tok_s=1500.0),
            _sglang(n_slots=48, ctx_total=61800, context_len=8192, prefill_tok_s=1500.0,
                    graph_bytes=int(0.5 * GIB)),
        ),
        Scenario(
            "moe_below_limit",
            "Qwen3-30B-A3B shapes (128 experts, 8 used) in Q8_0 on an H200, MoE kernels with "
            "the per-layer cost llama.cpp showed on the real card (238.6 tok/s at batch 1): "
            "about 16 % of the active-weight roofline.",
            QWEN3_30B_A3B_Q8, H200,
            EngineParams(n_slots=4, ctx_total=32768, **_moe(0.0010, 0.00035, 45e-6, 6000.0)),
            _sglang(n_slots=32, ctx_total=200000, context_len=32768, graph_bytes=0,
                    **_moe(0.0015, 0.0002, 60e-6, 12000.0)),
        ),
        Scenario(
            "moe_at_limit",
            "The same MoE model on a 72 GB card at 1.344e12 B/s, with fused MoE kernels and "
            "CUDA graphs: decode near the bandwidth limit of the bytes actually read "
            "(attention, router, output and the experts the batch routes to).",
            QWEN3_30B_A3B_Q8, RTX_PRO_5000,
            EngineParams(n_slots=8, ctx_total=32768, **_moe(0.0004, 0.00005, 5e-6, 12000.0)),
            _sglang(n_slots=32, ctx_total=60000, context_len=32768, graph_bytes=int(0.6 * GIB),
                    **_moe(0.0006, 0.00005, 3e-6, 16000.0)),
        ),
        Scenario(
            "moe_experts_on_host",
            "The MoE model (32.5 GB) on a 48 GB L40S with a 131072-token KV cache: llama.cpp "
            "--n-cpu-moe 20 keeps the routed experts of 20 of its 48 layers in host memory "
            "(12.8 GB) to make room, so every step reads their share from host RAM; SGLang "
            "offloads whole layers of its bf16 weights (--cpu-offload-gb).",
            QWEN3_30B_A3B_Q8, L40S,
            EngineParams(n_slots=4, ctx_total=131072, n_cpu_moe=20,
                         **_moe(0.0010, 0.0003, 10e-6, 1500.0)),
            _sglang(n_slots=8, ctx_total=16000, context_len=8192, n_gpu_layers=15, graph_bytes=0,
                    **_moe(0.0015, 0.0002, 10e-6, 1500.0)),
        ),
        Scenario(
            "spec_decode",
            "Qwen3-32B shapes in Q8_0 on an H200 with a draft (llama.cpp: Qwen3-0.6B Q8_0; "
            "SGLang: an EAGLE head) proposing 4 tokens per step, each accepted with p = 0.75: "
            "about 3 tokens per weight read, so per-sequence speed is above weights / bandwidth "
            "while each target step runs near the card's limit.",
            QWEN3_32B_Q8, H200,
            EngineParams(n_slots=4, ctx_total=16384, step_overhead_s=0.0015,
                         per_seq_overhead_s=0.0003, spec_draft_max=4, spec_accept_p=0.75,
                         draft_bytes=QWEN3_06B_Q8_BYTES, draft_step_overhead_s=0.0005,
                         draft_kv_bytes_per_token=QWEN3_06B_KV_BYTES_PER_TOKEN),
            _sglang(n_slots=16, ctx_total=200000, context_len=8192, step_overhead_s=0.0008,
                    per_seq_overhead_s=0.0001, spec_draft_max=4, spec_accept_p=0.75,
                    draft_bytes=EAGLE_32B_BYTES, draft_step_overhead_s=0.0003,
                    graph_bytes=int(0.8 * GIB)),
        ),
        Scenario(
            "card_throttled",
            "Gemma 3 27B shapes, Q4_0, on an H100 held at its 700 W power limit: NVML reports "
            "SW power cap and 1155 of 1980 MHz under load, so the engine's compute runs 1.7x "
            "slower and decode stays far below the bandwidth roofline; the card, not the "
            "engine, is the cause.",
            GEMMA3_27B_Q4, H100_POWER_CAPPED,
            EngineParams(n_slots=4, ctx_total=32768, compute_buffer_bytes=177 * MIB),
            # bf16 weights (54.9 GB) at 3.35 TB/s: 0.54 of the roofline at full clocks, 0.41
            # held at the power limit.
            _sglang(n_slots=16, ctx_total=60000, context_len=8192, graph_bytes=int(0.5 * GIB),
                    step_overhead_s=0.012),
        ),
        Scenario(
            "crossover",
            "A known crossover (compare llama.cpp, in use, with SGLang): the 8B Q4 on an L40S; "
            "llama.cpp with one slot and a lean step (about 150 tok/s alone, no more under "
            "load), SGLang with a heavier step (about 60 % of that alone) that batches 32 "
            "sequences: llama.cpp is ahead at 1, SGLang from 2 on.",
            MID_8B, L40S,
            EngineParams(n_slots=1, ctx_total=32768, step_overhead_s=0.001,
                         per_seq_overhead_s=0.0002, prefill_tok_s=8000.0),
            EngineParams(n_slots=32, ctx_total=200000, context_len=8192, step_overhead_s=0.0045,
                         per_seq_overhead_s=0.0003, prefill_tok_s=8000.0),
        ),
        Scenario(
            "kv_quantized",
            "Qwen3-8B shapes in Q4_0 on an L40S with an 8-bit KV cache (llama.cpp -ctk q8_0 "
            "-ctv q8_0, SGLang --kv-cache-dtype fp8_e5m2): the KV buffer is about half the "
            "16-bit estimate.",
            QWEN3_8B_Q4, L40S,
            _fast(n_slots=4, ctx_total=32768, cache_type_k="q8_0", cache_type_v="q8_0"),
            _fast(n_slots=32, ctx_total=200000, context_len=32768, kv_cache_dtype="fp8_e5m2"),
        ),
    )},
    **PREFILL_SCENARIOS,
}
# fmt: on


def get(name: str) -> Scenario:
    """Return the preset called `name` or raise KeyError listing the known ones."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})") from None
