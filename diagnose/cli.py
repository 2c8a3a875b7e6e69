"""The command line of `diagnose` and `compare`: their options and the run (the answer and
the outputs are `diagnose.answer`'s).

Both commands share one set of flags (`configure`), one resolver of their engines
(`diagnose.targets`, on `loadgen.resolve`) and one runner (`run_measurement`); they differ in
how many engines they take and how the answer is decided (`diagnose.procedure.diagnose`,
`diagnose.procedure.compare`). `cli.loadgen` registers `DIAGNOSE` and `COMPARE` with the
load generator's own commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from config.settings import Config, EngineConfig
from core import series as llmb
from core.conditions import VERDICTS
from diagnose import decide as decide_cmd
from diagnose.answer import exit_status, print_answer, write_outputs
from diagnose.decision.model import RunInfo, utc_now
from diagnose.decision.two_engines import CompareInputs
from diagnose.options import (
    DEFAULT_ROUNDS,
    Options,
    add_host_bandwidth_option,
    add_traffic,
    add_traffic_arguments,
    run_host_bandwidth,
)
from diagnose.phase_marks import PhasePublisher, say
from diagnose.procedure import compare, diagnose
from diagnose.served_load import add_answer_arguments, load_query, user_load
from diagnose.step_table import STEPS
from diagnose.targets import measured_engines, path_origins
from exporter import __version__
from loadgen.client import TargetUnreachable
from loadgen.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    Command,
    HelpFormatter,
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
from loadgen.prompts import CalibrationError
from loadgen.resolve import (
    load_config_or_usage,
)
from model.host_memory import HostBandwidth

log = logging.getLogger(__name__)


def add_measure_arguments(parser: argparse.ArgumentParser, rounds: int, load_from: bool) -> None:
    """Flags shared by diagnose and compare (besides the shared target/timeout options);
    `load_from`: also --load-from and its window and engine (compare)."""
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
    m.add_argument(
        "--parallel",
        type=positive_int,
        metavar="N",
        help="slots to launch with when the template has {parallel} "
        "(default: the largest concurrency)",
    )
    _add_sources(m)
    add_answer_arguments(m, find_max=True, load_from=load_from)


def _add_sources(m: Any) -> None:
    """Exporter, bandwidth and peak-compute flags of the measurement group, and --fail-on."""
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
    add_host_bandwidth_option(m)
    m.add_argument(
        "--peak-tflops",
        type=positive_float,
        metavar="TFLOP/S",
        help="the card's dense peak compute for the prefill roofline (default: the exporter's "
        f'{llmb.GPU_PEAK_FLOPS}{{dtype="bf16"}}, from the known-GPU table)',
    )
    # The same pair as run and sweep; off by default here (a run's marks are in its report).
    add_metrics_server_options(m, default_port=0)
    m.add_argument(
        "--fail-on",
        type=verdict_list,
        metavar="VERDICT[,VERDICT...]",
        help="exit 3 when an engine's verdict is one of these (for CI), e.g. kv_saturated",
    )


def _add_evidence(parser: argparse.ArgumentParser, per_engine: bool) -> None:
    """--log-file and --model-path: what an engine already running does not tell over HTTP."""
    e = parser.add_argument_group(
        "evidence of a running engine",
        "Without a launch template diagnose cannot choose the engine's log or see its files. "
        "llama-server names its model file in /props and SGLang in /server_info; neither "
        "names its log."
        + (
            " Each option is given once per engine, in the order of --url/--engine."
            if per_engine
            else ""
        ),
    )
    e.add_argument(
        "--log-file",
        type=Path,
        action="append",
        metavar="FILE",
        help="the engine's log (llama-server --log-file, started with -lv 4; SGLang's output): "
        "layers and weight buffers on the GPU, KV types and bytes, expert offload, "
        "speculative acceptance (default: the config's log_file, else not seen)",
    )
    e.add_argument(
        "--model-path",
        type=Path,
        action="append",
        metavar="PATH",
        help="the model the engine serves (a GGUF file, or SGLang's model folder): its "
        "geometry for the roofline and KV bytes (default: the config's model_path, else the "
        "path the engine names when it is readable here)",
    )


def verdict_list(text: str) -> frozenset[str]:
    """Comma-separated verdict names of the decision core (`--fail-on`)."""
    names = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(names - set(VERDICTS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"not a verdict: {', '.join(unknown) or repr(text)} (one of {', '.join(VERDICTS)})"
        )
    return frozenset(names)


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
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
        timeout=args.timeout,
        connect_timeout=args.connect_timeout,
        model=args.model,
        load=args.load,
        slo=args.slo,
        find_max=args.find_max,
    )


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


EXIT_CODES = (
    "Exit codes: 0 the answer is known; 3 an engine's verdict is one of --fail-on; 1 the "
    "engine is unreachable or was lost during the run (results.json holds the finished steps, "
    "partial), or results.json could not be written; 2 invalid arguments or configuration "
    "(compare: also a load --load-from's Prometheus cannot give, before anything is "
    "measured); "
    "130 interrupted by Ctrl-C or SIGTERM (results.json holds the finished steps, partial)."
)


@dataclass(frozen=True)
class Measurement:
    """How `diagnose` and `compare` differ: the engines they take and their description."""

    name: str
    help: str
    description: str
    rounds: int
    engines: int

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """The command's arguments (the same for both commands but the default rounds)."""
        parser.formatter_class = HelpFormatter
        parser.description = self.description
        parser.epilog = EXIT_CODES
        add_target_options(parser)
        add_timeout_options(parser)
        # The user's load picks between two engines only.
        add_measure_arguments(parser, rounds=self.rounds, load_from=self.engines > 1)
        add_traffic_arguments(parser)
        _add_evidence(parser, per_engine=self.engines > 1)

    def run(self, args: argparse.Namespace) -> int:
        """The command from parsed arguments; returns the exit status."""
        with quiet_libraries():
            return run_measurement(self.name, args)

    def command(self) -> Command:
        """The subcommand, for the one registration table (`cli.loadgen`)."""
        return Command(self.name, self.help, self.configure, self.run)


def announce(command: str, engines: list[EngineConfig], rounds: int) -> str:
    """Say what will be measured (and what a running engine cannot give); the title."""
    steps = ", ".join(STEPS)
    if command == "diagnose":
        (engine,) = engines
        say(f"diagnose {engine.name} ({engine.kind}, {engine.url}): steps {steps}")
        title = f"diagnose {engine.name}"
    else:
        a, b = engines
        say(f"compare {a.name} (in use) with {b.name}: steps {steps}, {rounds} rounds")
        title = f"compare {a.name} vs {b.name}"
    for engine in engines:
        if engine.launch is None:
            say(
                f"{engine.name} is already running (no launch template): the context sweep and "
                "the baseline memory and load time need a relaunch and are skipped; "
                "every other step runs on the engine as it is"
            )
    return title


def run_measurement(command: str, args: argparse.Namespace) -> int:
    """`diagnose` (one engine) or `compare` (two): measure, decide, answer, write."""
    info = run_info(getattr(args, "argv", None))
    config = load_config_or_usage(args.config)
    opts = options_from_args(args, config)
    # The traffic is read before any engine is asked: a bad --traffic costs nothing.
    add_traffic(args, opts)
    try:
        measured = measured_engines(command, args, config)
    except TargetUnreachable as exc:  # nothing answers at a --url: nothing to measure
        sys.stderr.write(f"llmb-loadgen {command}: {exc}\n")
        return EXIT_FAILED
    engines = measured.engines
    if opts.traffic is not None:
        say(f"your traffic: {opts.traffic.source}, {len(opts.traffic.requests)} requests")
    opts.path_origins = path_origins(args, engines)
    opts.probes = measured.probes
    opts.host_bandwidth = run_host_bandwidth(args, config)
    if opts.host_bandwidth is not None:
        say(f"host memory bandwidth: {opts.host_bandwidth.describe()}")
    if command == "compare":
        # Asked before measuring: a Prometheus that cannot answer costs no measurement.
        served = user_load(args.load, load_query(args), engines[0].name)
        if served is not None:
            opts.load, opts.load_source = served.concurrency, served.source
            say(f"your load: c={served.concurrency}, {served.source}")
    pub = PhasePublisher()
    stop_metrics = serve_metrics(pub, args.metrics_host, args.metrics_port)
    title = announce(command, engines, opts.rounds)
    try:
        if command == "diagnose":
            result, decision = asyncio.run(diagnose(engines[0], opts, args.out, pub))
            results = [result]
        else:
            results, decision = asyncio.run(compare((engines[0], engines[1]), opts, args.out, pub))
    except (TargetUnreachable, CalibrationError) as exc:
        sys.stderr.write(f"llmb-loadgen {command}: {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, as `run` does
        sys.stderr.write(f"llmb-loadgen {command}: interrupted\n")
        return EXIT_INTERRUPTED
    finally:
        stop_metrics()
    # The answer first: a report that cannot be written must not cost the verdict.
    print_answer(results, decision, args.out)
    written = write_outputs(args.out, results, decision, info, title=title)
    return exit_status(results, decision, args.fail_on or frozenset(), written)


DIAGNOSE = Measurement(
    "diagnose",
    "measure one engine step by step and say why it is slow (verdict, then the action)",
    "Measure one engine step by step (residency, single-request decode against the "
    "roofline, concurrency, KV pressure, context sweep) and say why it is slow.",
    rounds=1,
    engines=1,
).command()
COMPARE = Measurement(
    "compare",
    "the same requests against two engines: stay, stay_and_tune, switch_to, fix_memory_first "
    "or inconclusive",
    "Send the same requests to two engines (--engine A --engine B, or two running engines: "
    "--url A --url B; A in use) and say whether to stay and tune, switch, or fix memory first.",
    rounds=DEFAULT_ROUNDS,
    engines=2,
).command()


def run_decide(args: argparse.Namespace) -> int:
    """`decide DIR --out OUT`: the saved run decided again, written and answered like compare."""
    info = run_info(getattr(args, "argv", None))
    with quiet_libraries():
        inputs = CompareInputs(load=args.load, slo=args.slo)
        host = (
            HostBandwidth(args.host_bandwidth_gbs * 1e9, "flag")
            if args.host_bandwidth_gbs
            else None
        )
        engines, decision = decide_cmd.redecide(
            args.dir, args.in_use, inputs, load_query(args), host
        )
        decide_cmd.copy_requests(args.dir, args.out)
        write_outputs(args.out, engines, decision, info, title=decide_cmd.title_of(engines))
    print_answer(engines, decision, args.out)
    return 0


DECIDE = Command("decide", decide_cmd.HELP, decide_cmd.configure, run_decide)
