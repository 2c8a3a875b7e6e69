"""The command line of `diagnose` and `compare`: their options, the answer and the outputs.

Both commands share one set of flags (`configure`), one resolver of their engines
(`engines_from_args`, on `loadgen.resolve`) and one runner (`run_measurement`); they differ in
how many engines they take and how the answer is decided (`diagnose.procedure.diagnose`,
`diagnose.procedure.compare`). `cli.loadgen` registers `DIAGNOSE` and `COMPARE` with the
load generator's own commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from config.kinds import ENGINES, KINDS
from config.settings import Config, EngineConfig
from diagnose.decision.model import Decision, EngineResult, RunInfo, utc_now
from diagnose.decision.results import results_to_dict
from diagnose.engine_run import gib
from diagnose.options import DEFAULT_ROUNDS, Options
from diagnose.phase_marks import PhasePublisher, say
from diagnose.probe import probe_url
from diagnose.procedure import compare, diagnose
from diagnose.steps.base import STEPS
from exporter import __version__
from loadgen.client import TargetUnreachable
from loadgen.options import (
    Command,
    HelpFormatter,
    UsageError,
    add_exporter_option,
    add_max_tokens_option,
    add_metrics_server_options,
    add_out_option,
    add_prompt_tokens_option,
    add_target_options,
    add_timeout_options,
    int_list,
    non_negative_float,
    non_negative_int,
    one_value,
    positive_float,
    positive_int,
)
from loadgen.resolve import (
    api_key,
    engine_name,
    engines_from_config,
    load_config_or_usage,
)

log = logging.getLogger(__name__)


def add_measure_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """Flags shared by diagnose and compare (besides the shared target/timeout options)."""
    add_out_option(parser, required=True)
    m = parser.add_argument_group("measurement")
    m.add_argument(
        "--concurrency",
        type=int_list,
        default=[1, 2, 4, 8],
        metavar="N[,N...]",
        help="concurrency steps (closed loop)",
    )
    add_prompt_tokens_option(
        m,
        [128],
        "prompt length of the decode and concurrency steps: one value here (run and "
        "sweep take a list)",
    )
    add_max_tokens_option(m)
    m.add_argument(
        "--rounds",
        type=positive_int,
        default=rounds,
        metavar="N",
        help="rounds of every load step; the spread over rounds is reported",
    )
    m.add_argument(
        "--requests-per-slot",
        type=positive_int,
        default=2,
        metavar="N",
        help="requests per round = concurrency x this",
    )
    m.add_argument(
        "--contexts",
        type=int_list,
        metavar="N[,N...]",
        help="context sweep (restarts); the first is the launch context "
        "(default: double up to the trained context or where memory gives out)",
    )
    m.add_argument(
        "--max-context",
        type=positive_int,
        metavar="N",
        help="stop the automatic context sweep here (default: the trained context)",
    )
    m.add_argument(
        "--kv-prompt-tokens",
        type=non_negative_int,
        metavar="N",
        help="prompt length of the KV-pressure step; 0 skips it "
        "(default: half a slot's context, at most 16384)",
    )
    m.add_argument(
        "--settle",
        type=non_negative_float,
        metavar="S",
        help="seconds to wait after a launch (default: the config's settle_seconds)",
    )
    _add_launch_and_sources(m)


def _add_launch_and_sources(m: Any) -> None:
    """Launch, exporter and bandwidth flags of the measurement group."""
    m.add_argument(
        "--parallel",
        type=positive_int,
        metavar="N",
        help="slots to launch with when the template has {parallel} "
        "(default: the largest concurrency)",
    )
    add_exporter_option(
        m,
        "llmb-exporter to read GPU memory, residency, KV and queue from "
        "(with or without /metrics); its samples decide the verdict",
    )
    m.add_argument(
        "--exporter-engine",
        metavar="NAME",
        help="the engine's name in the exporter when it differs (default: the same)",
    )
    m.add_argument(
        "--bandwidth-gbs",
        type=positive_float,
        metavar="GB/S",
        help="GPU memory bandwidth for the roofline (default: exporter, NVML table)",
    )
    # The same pair as run and sweep; off by default here (a run's marks are in its report).
    add_metrics_server_options(m, default_port=0)


def options_from_args(args: argparse.Namespace, config: Config | None) -> Options:
    """Options from parsed flags (the config's GPU bandwidth underneath --bandwidth-gbs)."""
    bw = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None
    if bw is None and config is not None:
        cfg_bw = config.gpu.bandwidth_bytes_per_second
        if isinstance(cfg_bw, (int, float)):
            bw = float(cfg_bw)
    return Options(
        concurrency=args.concurrency,
        prompt_tokens=one_value(args.prompt_tokens, "--prompt-tokens"),
        max_tokens=args.max_tokens,
        rounds=args.rounds,
        requests_per_slot=args.requests_per_slot,
        contexts=args.contexts,
        max_context=args.max_context,
        kv_prompt_tokens=args.kv_prompt_tokens,
        settle=args.settle,
        parallel=args.parallel,
        exporter_url=args.exporter_url,
        exporter_engine=args.exporter_engine,
        gpu=config.gpu if config is not None else None,
        bandwidth_bytes_per_s=bw,
        timeout=args.timeout,
        connect_timeout=args.connect_timeout,
    )


def engines_from_args(args: argparse.Namespace, config: Config | None) -> list[EngineConfig]:
    """Engines from --engine (config, with launch templates) or --url (already running)."""
    engines = engines_from_config(args, config)
    if engines:
        return engines
    key = api_key(args)  # an unset --api-key-env is an error here as in run
    kind, model = asyncio.run(probe_url(args.url, key, args.kind, model=not args.name))
    if kind not in KINDS:
        endpoints = " nor ".join(f"{e.display}'s {e.info.paths[0]}" for e in ENGINES)
        raise UsageError(
            f"{args.url} answers neither {endpoints}; pass "
            + " or ".join(f"--kind {k}" for k in KINDS)
        )
    name = args.name or model or kind
    return [
        EngineConfig(name=engine_name(name), kind=kind, url=args.url, api_key_env=args.api_key_env)
    ]


def serve_metrics(pub: PhasePublisher, host: str, port: int) -> Callable[[], None]:
    """Serve the phase metrics on host:port (port 0: not); returns the function that stops it."""
    if not port:
        return lambda: None
    try:
        server, _thread = start_http_server(port, addr=host, registry=pub.registry)
    except (OSError, ValueError) as exc:
        # The measurement matters more than the Grafana marks: warn and go on.
        log.warning("cannot serve phase metrics on %s:%d: %s", host, port, exc)
        return lambda: None

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return stop


def run_info(argv: list[str] | None = None) -> RunInfo:
    """The metadata block: tool version, the command line as typed, the UTC start time."""
    words = ["llmb-loadgen", *(sys.argv[1:] if argv is None else argv)]
    return RunInfo(
        command=" ".join(shlex.quote(w) for w in words),
        tool_version=__version__,
        started_at=utc_now(),
    )


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Keep the terminal to our progress lines: no per-request or per-poll logging.

    The embedded exporter collectors warn each time a relaunched engine is not up yet;
    during a context sweep that is expected, so only their errors are shown. The levels are
    restored afterwards: a caller in the same process (a test, a notebook) keeps its logging.
    """
    levels = {"exporter": logging.ERROR}
    for name in ("httpx", "loadgen.scheduler", "loadgen.client", "loadgen.prompts",
                 "matplotlib"):  # fmt: skip
        levels[name] = logging.WARNING
    saved = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def print_answer(engines: list[EngineResult], decision: Decision, out: Path) -> None:
    """The answer on stdout, once: verdict(s), recommendation, action, steps, caveats."""
    width = 16
    lines = []
    for name, v in decision.verdict.items():
        lines.append(f"{'verdict':<{width}}{name}: {v}")
    lines.append(f"{'recommendation':<{width}}{decision.recommendation}")
    lines.append(f"{'action':<{width}}{decision.action}")
    if len(engines) > 1:
        lines.append(f"{'comparable':<{width}}{'yes' if decision.comparable else 'no'}")
    for step in decision.steps:
        lines.append(f"  {step.key:<{width - 2}}{step.answer}")
    for e in engines:
        roof = e.roofline
        if roof.efficiency is not None and roof.limit_tok_s:
            if roof.misfit is not None:
                lines.append(
                    f"{'roofline':<{width}}{e.name}: does not fit ({roof.misfit}): "
                    f"{roof.efficiency * 100:.0f} % of {roof.limit_tok_s:.1f} tok/s is beyond "
                    "physics, so no decode verdict"
                )
            else:
                lines.append(
                    f"{'roofline':<{width}}{e.name}: {roof.efficiency * 100:.0f} % of "
                    f"{roof.limit_tok_s:.1f} tok/s"
                )
        if e.spec_accept_length is not None:
            lines.append(
                f"{'acceptance':<{width}}{e.name}: {e.spec_accept_length:.2f} tokens per "
                "model step (speculative decoding)"
            )
        if e.experts_host_layers:
            lines.append(
                f"{'expert offload':<{width}}{e.name}: experts of {e.experts_host_layers:.0f} "
                f"layers in host memory ({gib(e.experts_host_bytes)})"
            )
    for est in decision.estimates:
        lines.append(f"{'estimate':<{width}}{est.basis} ≈ {est.tok_s:.1f} tok/s")
    for c in decision.caveats:
        lines.append(f"{'caveat':<{width}}{c}")
    lines.append(f"{'report':<{width}}{out / 'report.html'}")
    print("\n".join(lines))


def write_outputs(
    out: Path, engines: list[EngineResult], decision: Decision, run: RunInfo, title: str
) -> None:
    """report.md, report.html and results.json (one renderer for all three)."""
    from diagnose.report.html.write import write_report

    run.finished_at = utc_now()
    write_report(out, engines, decision, title, run)
    # results.json carries the run's metadata whatever the renderer adds to it.
    doc = results_to_dict(engines, decision, run)
    doc["title"] = title
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=str) + "\n", "utf-8")


@dataclass(frozen=True)
class Measurement:
    """How `diagnose` and `compare` differ: the engines they take and their description."""

    name: str
    help: str
    description: str
    rounds: int

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """The command's arguments (the same for both commands but the default rounds)."""
        parser.formatter_class = HelpFormatter
        parser.description = self.description
        add_target_options(parser)
        add_timeout_options(parser)
        add_measure_arguments(parser, rounds=self.rounds)

    def run(self, args: argparse.Namespace) -> int:
        """The command from parsed arguments; returns the exit status."""
        with quiet_libraries():
            return run_measurement(self.name, args)

    def command(self) -> Command:
        """The subcommand, for the one registration table (`cli.loadgen`)."""
        return Command(self.name, self.help, self.configure, self.run)


def _engines(command: str, args: argparse.Namespace, config: Config | None) -> list[EngineConfig]:
    engines = engines_from_args(args, config)
    if command == "diagnose" and len(engines) != 1:
        raise UsageError("diagnose measures one engine: give one --engine (compare takes two)")
    if command == "compare" and len(engines) != 2:
        raise UsageError("compare needs exactly two engines: --engine A --engine B (A in use)")
    return engines


def run_measurement(command: str, args: argparse.Namespace) -> int:
    """`diagnose` (one engine) or `compare` (two): measure, decide, write, answer."""
    info = run_info(getattr(args, "argv", None))
    if command == "compare" and args.url:
        raise UsageError("compare needs two engines from --config: --engine A --engine B")
    config = load_config_or_usage(args.config)
    engines = _engines(command, args, config)
    opts = options_from_args(args, config)
    pub = PhasePublisher()
    stop_metrics = serve_metrics(pub, args.metrics_host, args.metrics_port)
    if command == "diagnose":
        (engine,) = engines
        say(f"diagnose {engine.name} ({engine.kind}, {engine.url}): steps {', '.join(STEPS)}")
        title = f"diagnose {engine.name}"
    else:
        a, b = engines
        say(
            f"compare {a.name} (in use) with {b.name}: steps {', '.join(STEPS)}, "
            f"{opts.rounds} rounds"
        )
        title = f"compare {a.name} vs {b.name}"
    try:
        if command == "diagnose":
            result, decision = asyncio.run(diagnose(engines[0], opts, args.out, pub))
            results = [result]
        else:
            results, decision = asyncio.run(compare((engines[0], engines[1]), opts, args.out, pub))
    except TargetUnreachable as exc:
        sys.stderr.write(f"llmb-loadgen {command}: {exc}\n")
        return 1
    finally:
        stop_metrics()
    write_outputs(args.out, results, decision, info, title=title)
    print_answer(results, decision, args.out)
    return 0


DIAGNOSE = Measurement(
    "diagnose",
    "measure one engine step by step and say why it is slow (verdict, then the action)",
    "Measure one engine step by step (residency, single-request decode against the "
    "roofline, concurrency, KV pressure, context sweep) and say why it is slow.",
    rounds=1,
).command()
COMPARE = Measurement(
    "compare",
    "the same requests against two engines: stay_and_tune, switch_to, fix_memory_first "
    "or inconclusive",
    "Send the same requests to two engines (--engine A --engine B, A in use) and say "
    "whether to stay and tune, switch, or fix memory first.",
    rounds=DEFAULT_ROUNDS,
).command()
