"""What `diagnose` and `compare` measure: the typed options the command line fills."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from config.settings import Config, GpuConfig
from core import series as llmb
from core.slo import Slo
from loadgen.options import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT_S,
    UsageError,
    add_traffic_options,
    positive_float,
)
from loadgen.resolve import TargetProbe
from loadgen.scheduler.spec import DEFAULT_REQUESTS
from loadgen.traffic.flags import read_traffic, traffic_given
from loadgen.traffic.model import Traffic
from model.host_memory import HostBandwidth, host_bandwidth, measure_host_bandwidth

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
    # Host memory bandwidth for the expert-offload bound: --host-bandwidth-gbs, the config's
    # key, else measured once before the run (None: the exporter's series, or unknown).
    host_bandwidth: HostBandwidth | None = None
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
    # The one probe of each engine already running at --url, by engine name (the facts read
    # it instead of asking the engine again).
    probes: dict[str, TargetProbe] = field(default_factory=dict)
    # The user's concurrency (compare --load) and SLO (--slo): what the answer is given for.
    load: int | None = None
    slo: Slo | None = None
    # Where `load` came from (--load, or --load-from's query); said beside the answer.
    load_source: str | None = None
    # --find-max: bisect between measured concurrencies for the highest within --slo.
    find_max: bool = False
    # --traffic/--traffic-from: the load steps replay this instead of fixed prompts
    # (docs/diagnose.md, "Your traffic"), `time_scale` and `schedule` as in `run`.
    traffic: Traffic | None = None
    time_scale: float = 1.0
    schedule: bool = True

    def traffic_width(self) -> int:
        """The traffic step's concurrency: a mix's own closed-loop width, else the highest
        --concurrency (a scheduled replay's cap on requests in flight)."""
        own = self.traffic.concurrency if self.traffic is not None else None
        return own or max(self.concurrency)


def add_host_bandwidth_option(group: Any) -> None:
    """--host-bandwidth-gbs of diagnose, compare and decide."""
    group.add_argument(
        "--host-bandwidth-gbs",
        type=positive_float,
        metavar="GB/S",
        help="host memory bandwidth for the expert-offload bound (default: the config's "
        "host_memory_bandwidth_bytes_per_second, else the exporter's "
        f"{llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND}, else measured here before the run: "
        "a multi-threaded copy, read + write counted, under a second)",
    )


def run_host_bandwidth(
    args: argparse.Namespace,
    config: Config | None,
    measure: Callable[[], float] = measure_host_bandwidth,
) -> HostBandwidth | None:
    """The host bandwidth of a measuring run: the flag, the config, else (without
    --exporter-url, whose exporter measures its own host) `measure()` once, here."""
    flag = args.host_bandwidth_gbs * 1e9 if args.host_bandwidth_gbs else None
    configured = config.host_memory_bandwidth_bytes_per_second if config is not None else None
    if flag is None and configured is None and getattr(args, "exporter_url", None):
        return None
    return host_bandwidth(flag, configured, measure)


def add_traffic_arguments(parser: argparse.ArgumentParser) -> None:
    """--traffic, --traffic-from and their modifiers: `run`'s flags, the same meanings."""
    add_traffic_options(
        parser.add_argument_group(
            "traffic (docs/diagnose.md, 'Your traffic')",
            "Replay your traffic in the concurrency step instead of fixed prompts, at the "
            "highest --concurrency (a scheduled replay's cap on requests in flight, else the "
            "closed loop's width); the single, KV-pressure and context steps are skipped. "
            f"A mix without n= draws {DEFAULT_REQUESTS} requests.",
        )
    )


def add_traffic(args: argparse.Namespace, opts: Options) -> None:
    """The traffic of the flags into `opts` (none given: the fixed prompts); a UsageError when
    the flags contradict each other or the source cannot be read, before anything runs."""
    if not traffic_given(args):
        return
    if getattr(args, "find_max", False):
        raise UsageError(
            "--find-max bisects the fixed prompts' concurrency; your traffic runs at its own "
            "width (drop --find-max or --traffic)"
        )
    opts.traffic = read_traffic(args, DEFAULT_REQUESTS)
    opts.time_scale, opts.schedule = args.time_scale, not args.no_schedule
