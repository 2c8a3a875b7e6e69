"""What `diagnose` and `compare` measure: the typed options the command line fills."""

from __future__ import annotations

from dataclasses import dataclass, field

from config.settings import GpuConfig

# `compare`'s --rounds default: a difference is called only beyond the spread of rounds.
DEFAULT_ROUNDS = 3


@dataclass
class Options:
    """What to measure; every list is one sweep."""

    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    prompt_tokens: int = 128
    max_tokens: int = 128
    rounds: int = 1
    requests_per_slot: int = 2
    # None: automatic (double up to the trained context); []: no context sweep.
    contexts: list[int] | None = None
    max_context: int | None = None
    # None: automatic (half a slot's context); 0: no KV-pressure step.
    kv_prompt_tokens: int | None = None
    settle: float | None = None
    parallel: int | None = None
    exporter_url: str | None = None
    exporter_engine: str | None = None
    # GPU sampling of the embedded collectors (the config's `gpu:`; None: NVML if present).
    gpu: GpuConfig | None = None
    bandwidth_bytes_per_s: float | None = None
    # The card's dense peak compute for the prefill roofline (--peak-tflops; None: table).
    peak_flops: float | None = None
    timeout: float = 600.0
    connect_timeout: float = 5.0
    sample_interval: float = 0.5
    # The model name sent with every request (--model; None: the engine's first model).
    model: str | None = None
    # Where each engine's log and model path came from on the command line:
    # "<engine>.log" / "<engine>.model" -> "--log-file" / "--model-path" (else the config).
    path_origins: dict[str, str] = field(default_factory=dict)
