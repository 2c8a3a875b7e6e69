"""The GPU memory dashboard: per card, per process and per engine, beside what the model needs."""

from __future__ import annotations

from core import series as llmb
from mixin.config import MixinConfig
from mixin.dashboards.card import card_row
from mixin.dashboards.panels import (
    HSEL,
    SEL,
    Dashboard,
    Limit,
    Row,
    Target,
    gpu_used_and_peak,
    mib,
    ts,
)


def _device_row(cfg: MixinConfig) -> Row:
    """Per card: used, peak, total, headroom, utilization."""
    return Row(
        "Device",
        [
            ts(
                "Used, windowed peak and total",
                *gpu_used_and_peak(),
                Target(
                    f"max by (host, gpu) ({llmb.GPU_MEMORY_TOTAL_BYTES}{{{HSEL}}})",
                    "{{host}} GPU {{gpu}} total",
                ),
                unit="bytes",
                width=12,
                description=(
                    "GPU memory in use per card (NVML, as nvidia-smi shows it), the highest "
                    "use the exporter's background sampler saw over its peak window, and "
                    "the card's total. The peak catches short spikes (prefill, CUDA graph "
                    "capture) that a scrape every few seconds misses."
                ),
            ),
            ts(
                "Headroom at the peak",
                Target(
                    f"gpu:llmb_gpu_memory_headroom_bytes:peak{{{HSEL}}}", "{{host}} GPU {{gpu}}"
                ),
                unit="bytes",
                width=6,
                limit=Limit("gpu_headroom_min_bytes", "above"),
                description=(
                    "Memory left at the windowed peak: total - driver-reserved - peak used "
                    "(`gpu:llmb_gpu_memory_headroom_bytes:peak`). Below the line "
                    f"(`gpu_headroom_min_bytes` = {mib('gpu_headroom_min_bytes')}) the "
                    "next larger batch or context can fail to allocate and "
                    "LLMGPUMemoryNearFull fires: lower the engine's memory fraction or "
                    f"context, or move another process off the card. "
                    f"{cfg.runbook_url}#llmgpumemorynearfull"
                ),
            ),
            ts(
                "Used / total and utilization",
                Target(f"gpu:llmb_gpu_memory_used:ratio{{{HSEL}}}", "{{host}} GPU {{gpu}} memory"),
                Target(
                    f"max by (host, gpu) ({llmb.GPU_UTILIZATION_RATIO}{{{HSEL}}})",
                    "{{host}} GPU {{gpu}} busy",
                ),
                unit="percentunit",
                width=6,
                description=(
                    "Share of the card's memory in use, and the share of time a kernel "
                    "ran (NVML utilization). Engines preallocate their KV pool, so high "
                    "memory use alone is normal; busy near 100 % with slow decode points "
                    "at compute, low busy at the host side or the scheduler."
                ),
            ),
        ],
    )


def _process_row() -> Row:
    """Per process and per engine on each card."""
    return Row(
        "Processes",
        [
            ts(
                "GPU memory per process",
                Target(
                    "max by (host, gpu, pid, process, engine) "
                    f"({llmb.GPU_PROCESS_MEMORY_USED_BYTES}{{{HSEL}}})",
                    "{{host}} GPU {{gpu}} {{process}} ({{pid}}) -> {{engine}}",
                ),
                unit="bytes",
                width=12,
                description=(
                    "GPU memory of each process on each card (NVML), with the engine it "
                    "is attributed to (empty when no configured engine matches its PID "
                    "or command line). An unknown process here takes memory the engines "
                    "could use."
                ),
            ),
            ts(
                "GPU memory per engine and GPU",
                Target(
                    f"engine_gpu:llmb_gpu_process_memory_used_bytes:sum{{{SEL}}}",
                    "{{host}}/{{engine}} on GPU {{gpu}}",
                ),
                unit="bytes",
                width=12,
                description=(
                    "Process GPU memory summed per engine and card. An engine split over "
                    "several GPUs (tensor parallel, llama.cpp `--split-mode`) shows one "
                    "line per card; an uneven split shows here first."
                ),
            ),
        ],
    )


def _expected_row() -> Row:
    """What the engine holds beside what the model needs."""
    return Row(
        "Expected beside actual",
        [
            ts(
                "Engine process memory vs weights and KV",
                Target(
                    f"max by (host, engine) ({llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES}{{{SEL}}})",
                    "{{host}}/{{engine}} process (actual)",
                ),
                Target(
                    f"max by (host, engine) ({llmb.ENGINE_PROCESS_GPU_MEMORY_PEAK_BYTES}{{{SEL}}})",
                    "{{host}}/{{engine}} process peak",
                ),
                Target(
                    f"max by (host, engine) ({llmb.MODEL_WEIGHTS_BYTES}{{{SEL}}})",
                    "{{host}}/{{engine}} weights (expected)",
                ),
                Target(
                    f"max by (host, engine) ({llmb.MODEL_KV_CACHE_BYTES_ESTIMATED}{{{SEL}}})",
                    "{{host}}/{{engine}} KV (expected)",
                ),
                unit="bytes",
                width=12,
                description=(
                    "What the engine holds on the GPUs (NVML, summed over its processes) "
                    "beside what the model needs: weight bytes (GGUF / safetensors size) "
                    "and the KV cache its context should take (from the architecture). "
                    "Actual well below weights + KV means offloaded weights or a smaller "
                    "KV pool than configured."
                ),
            ),
            ts(
                "Buffers the engine reports",
                Target(
                    f"max by (host, engine, device) ({llmb.ENGINE_MODEL_BUFFER_BYTES}{{{SEL}}})",
                    "{{host}}/{{engine}} weights on {{device}}",
                ),
                Target(
                    f"max by (host, engine, device) ({llmb.ENGINE_KV_CACHE_BYTES}{{{SEL}}})",
                    "{{host}}/{{engine}} KV on {{device}}",
                ),
                unit="bytes",
                width=12,
                description=(
                    "Weight and KV buffers per device as the engine reports them "
                    "(llama.cpp log: CUDA0, CPU_Mapped; SGLang: gpu, cpu). Weights on a "
                    "CPU device mean offloaded layers: every decode step reads them over "
                    "PCIe."
                ),
            ),
        ],
    )


def gpu_memory(cfg: MixinConfig) -> Dashboard:
    """GPU memory: device, peak, per process with engine attribution, expected vs actual."""
    rows = [_device_row(cfg), card_row(cfg), _process_row(), _expected_row()]
    return Dashboard(
        "llmb-gpu-memory",
        "LLM bottleneck: GPU memory",
        "GPU memory per card, per process and per engine, with what the model should need.",
        rows,
    )
