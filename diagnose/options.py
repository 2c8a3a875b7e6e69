"""What `diagnose` and `compare` measure: the typed options the command line fills."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from config.settings import GpuConfig
from core.slo import Slo
from diagnose.served_load import add_load_from_arguments
from loadgen.options import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT_S,
    add_slo_option,
    positive_int,
)

# `compare`'s --rounds default: a difference is called only beyond the spread of rounds.
DEFAULT_ROUNDS = 3


@dataclass
class Options:
    """What to measure; every list is one sweep."""

    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    prompt_tokens: int = 128
    max_tokens: int = DEFAULT_MAX_TOKENS
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
    timeout: float = DEFAULT_TIMEOUT_S
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    sample_interval: float = 0.5
    # The model name sent with every request (--model; None: the engine's first model).
    model: str | None = None
    # Where each engine's log and model path came from on the command line:
    # "<engine>.log" / "<engine>.model" -> "--log-file" / "--model-path" (else the config).
    path_origins: dict[str, str] = field(default_factory=dict)
    # The user's concurrency (compare --load) and SLO (--slo): what the answer is given for.
    load: int | None = None
    slo: Slo | None = None
    # Where `load` came from (--load, or --load-from's query); said beside the answer.
    load_source: str | None = None
    # --find-max: bisect between measured concurrencies for the highest within --slo.
    find_max: bool = False


def add_answer_arguments(group: Any, *, find_max: bool, load_from: bool) -> None:
    """What the answer is for: --load and --slo (compare, diagnose and decide); with
    `find_max` --find-max (diagnose and compare: it measures more levels); with `load_from`
    the load read from Prometheus (compare and decide: `diagnose.served_load`)."""
    group.add_argument(
        "--load",
        type=positive_int,
        metavar="N",
        help="the concurrency you serve: the recommendation is for this load; it wins over "
        "--load-from (compare, decide) (default: the answer at every measured load, the "
        "highest deciding)",
    )
    add_slo_option(group, "goodput per step and the highest load within it")
    if find_max:
        group.add_argument(
            "--find-max",
            action="store_true",
            help="with --slo: measure between the concurrency levels (bisection) for the "
            "highest load within the SLO",
        )
    if load_from:
        add_load_from_arguments(group)
