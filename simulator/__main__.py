"""Command line: `llmb-sim --kind llamacpp|sglang --port P --scenario NAME`, or `llmb-sim demo`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from config.kinds import kinds
from exporter import versioned_parser
from simulator import scenarios
from simulator.common import Faults, SimBase, SimOptions, simulator_class
from simulator.model import LLAMACPP_KV_TYPES, SGLANG_KV_BYTES
from simulator.sglang.spec import DEFAULT_VERSION, VERSIONS
from simulator.tokenizer import NAMES as TOKENIZERS


def build_parser() -> argparse.ArgumentParser:
    """Options mirror the engines' own flags where one exists."""
    p = versioned_parser(
        "llmb-sim",
        "Simulated llama-server / SGLang with a performance model (tests, demo). "
        "Run `llmb-sim demo --help` for the all-in-one demo.",
    )
    p.add_argument("--kind", choices=kinds(), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--scenario", default="healthy", choices=sorted(scenarios.SCENARIOS))
    p.add_argument("--tokenizer", default="word", choices=TOKENIZERS)
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="wall seconds per simulated second"
    )
    p.add_argument("--load-seconds", type=float, default=None, help="simulated model load phase")
    p.add_argument("--api-key", default=None)
    p.add_argument("--no-metrics", action="store_true", help="llama.cpp: /metrics answers 501")
    p.add_argument("--no-slots", action="store_true", help="llama.cpp: /slots answers 501")
    p.add_argument("-np", "--parallel", type=int, default=None, help="slots (SGLang: max running)")
    p.add_argument("-c", "--ctx-size", type=int, default=None, help="KV capacity in tokens")
    p.add_argument("--context-length", type=int, default=None, help="SGLang context_len")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=None)
    p.add_argument("--kv-unified", action="store_true")
    p.add_argument(
        "-ncmoe", "--n-cpu-moe", type=int, default=None, help="llama.cpp: N layers' experts on CPU"
    )
    kv_types = sorted(LLAMACPP_KV_TYPES)
    p.add_argument("-ctk", "--cache-type-k", choices=kv_types, default=None, help="llama.cpp")
    p.add_argument("-ctv", "--cache-type-v", choices=kv_types, default=None, help="llama.cpp")
    p.add_argument("--kv-cache-dtype", choices=sorted(SGLANG_KV_BYTES), default=None, help="SGLang")
    p.add_argument(
        "--gpu-state-file",
        type=Path,
        default=None,
        help="write NVML-shaped JSON of the simulated card here (the exporter's gpu.fake_file)",
    )
    p.add_argument(
        "--gpu-index",
        type=int,
        default=0,
        help="NVML index of the simulated card (default 0; give each simulator its own)",
    )
    p.add_argument("--log-file", type=Path, default=None, help="llama.cpp: llama-server log")
    p.add_argument("--metric-spelling", choices=("colon", "underscore"), default="colon")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument(
        "--sglang-version",
        choices=VERSIONS,
        default=DEFAULT_VERSION,
        help="SGLang: the release whose /metrics families and answers to give "
        f"(default {DEFAULT_VERSION})",
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME=P",
        help="inject failures: error_rate, hang_rate, stream_cut_rate, metrics_garbage_rate",
    )
    p.add_argument("--fault-seed", type=int, default=None)
    return p


def options_from_args(args: argparse.Namespace) -> SimOptions:
    """Turn parsed arguments into simulator options."""
    scenario = scenarios.get(args.scenario)
    params = scenario.params(args.kind)
    changes: dict[str, object] = {}
    if args.parallel is not None:
        changes["n_slots"] = args.parallel
    if args.ctx_size is not None:
        changes["ctx_total"] = args.ctx_size
    if args.context_length is not None:
        changes["context_len"] = args.context_length
    if args.n_gpu_layers is not None:
        changes["n_gpu_layers"] = args.n_gpu_layers
    if args.kv_unified:
        changes["kv_unified"] = True
    if args.load_seconds is not None:
        changes["load_seconds"] = args.load_seconds
    for flag in ("cache_type_k", "cache_type_v", "kv_cache_dtype", "n_cpu_moe"):
        if getattr(args, flag) is not None:
            changes[flag] = getattr(args, flag)
    return SimOptions(
        kind=args.kind,
        scenario=scenario,
        params=replace(params, **changes),  # type: ignore[arg-type]
        host=args.host,
        port=args.port,
        tokenizer=args.tokenizer,
        time_scale=args.time_scale,
        api_key=args.api_key,
        metrics=not args.no_metrics,
        slots=not args.no_slots,
        gpu_state_file=args.gpu_state_file,
        gpu_index=args.gpu_index,
        log_file=args.log_file,
        metric_spelling=args.metric_spelling,
        enable_cache_report=args.enable_cache_report,
        sglang_version=args.sglang_version,
        served_model_name=args.served_model_name,
        faults=Faults.parse(args.fault, args.fault_seed),
    )


def make_sim(opts: SimOptions) -> SimBase:
    """The simulator object for `opts.kind` (the class its row names)."""
    return simulator_class(opts.kind)(opts)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `llmb-sim`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from simulator.demo import main as demo_main

        return demo_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        opts = options_from_args(args)
    except (ValueError, KeyError) as exc:
        parser.error(str(exc))
    sim = make_sim(opts)
    print(
        f"llmb-sim {opts.kind} scenario={opts.scenario.name} on http://{opts.host}:{opts.port}",
        flush=True,
    )
    try:
        web.run_app(
            sim.build_app(),
            host=opts.host,
            port=opts.port,
            print=None,
            handler_cancellation=True,  # a client that goes away aborts its request
        )
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
