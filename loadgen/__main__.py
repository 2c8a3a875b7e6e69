"""Command line: `llmb-loadgen run|sweep ...` (or `python -m loadgen`).

Subcommands are `Command` objects; `default_commands()` also picks up optional modules
(`loadgen.diagnose`, `loadgen.compare`) that expose `command() -> Command`, or, failing
that, `main(argv) -> int` (the rest of the command line is handed over as is), so new
commands plug in without touching this file.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.config import Config, ConfigError, load_config
from loadgen.client import Target
from loadgen.metrics import DEFAULT_PORT
from loadgen.prompts import CACHE_MODES
from loadgen.scheduler import RunSpec
from loadgen.session import EXIT_USAGE, SessionOptions, execute
from loadgen.sweep import plan_steps, probe_factory

OPTIONAL_COMMAND_MODULES = ("loadgen.diagnose", "loadgen.compare")


class UsageError(Exception):
    """Invalid arguments or configuration (exit code 2)."""


@dataclass(frozen=True)
class Command:
    """A subcommand: adds its arguments to a subparser and runs with the parsed namespace."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    # A command that parses its own arguments: main() hands it argv after the name.
    passthrough: Callable[[list[str]], int] | None = None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """--config/--engine or --url/--kind, shared by every command that sends requests."""
    group = parser.add_argument_group("target")
    group.add_argument(
        "--config",
        default=os.environ.get("LLMB_CONFIG"),
        help="the exporter's YAML config; engines are then chosen by name (env LLMB_CONFIG)",
    )
    group.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME",
        help="engine name from the config; repeat to compare engines on the same prompts",
    )
    group.add_argument(
        "--url", help="base URL of an OpenAI-compatible server (instead of --engine)"
    )
    group.add_argument(
        "--kind",
        choices=["llamacpp", "sglang", "openai"],
        default="openai",
        help="server kind with --url (llamacpp enables /tokenize calibration)",
    )
    group.add_argument("--name", default="target", help="engine label for --url (default target)")
    group.add_argument("--api-key-env", help="environment variable holding the API key (--url)")
    group.add_argument("--model", help="model name to send (default: first id of /v1/models)")


def add_load_arguments(parser: argparse.ArgumentParser, sweep: bool = False) -> None:
    """Load shape, prompt, request and output arguments."""
    load = parser.add_argument_group("load")
    if sweep:
        load.add_argument(
            "--concurrency", type=_int_list, default=[1], help="comma list, e.g. 1,2,4,8"
        )
        load.add_argument(
            "--prompt-tokens", type=_int_list, default=[512], help="comma list, e.g. 512,2048"
        )
        load.add_argument(
            "--grid",
            action="store_true",
            help="full product of both lists (consecutive steps still differ in one variable)",
        )
        load.add_argument(
            "--pause", type=float, default=10.0, help="seconds between steps (default 10)"
        )
    else:
        load.add_argument(
            "--concurrency",
            type=_positive_int,
            default=None,
            help="closed loop: requests kept in flight (default 1); with --rate: in-flight cap",
        )
        load.add_argument(
            "--prompt-tokens",
            type=_positive_int,
            default=None,
            help="build a prompt of this many tokens, calibrated on the server (default 512)",
        )
    load.add_argument(
        "--rate", type=_positive_float, help="open loop: requests per second (default: closed loop)"
    )
    load.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
    load.add_argument(
        "--requests", type=_positive_int, help="measured requests per engine and step (default 32)"
    )
    load.add_argument(
        "--duration", type=_positive_float, help="seconds per engine and step instead of --requests"
    )
    load.add_argument(
        "--warmup", type=_non_negative_int, default=0, help="warm-up requests, not recorded"
    )
    load.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="per-request timeout in s (600)"
    )
    load.add_argument(
        "--connect-timeout", type=_positive_float, default=5.0, help="connect timeout in s (5)"
    )
    prompt = parser.add_argument_group("prompt and request")
    prompt.add_argument("--prompt-file", type=Path, help="use this text as the prompt")
    prompt.add_argument("--max-tokens", type=_positive_int, default=128, help="output length (128)")
    prompt.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    prompt.add_argument(
        "--cache",
        choices=CACHE_MODES,
        default="unique",
        help="unique: distinct prefix per request, defeats prompt caches (default); "
        "same: one identical prompt",
    )
    prompt.add_argument("--seed", type=int, default=1234, help="sampling seed sent (1234)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, help="output folder (default out/<command>-<time>)")
    out.add_argument(
        "--metrics-port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"serve live llmb_loadgen_* metrics here (default {DEFAULT_PORT}; 0 = off)",
    )
    out.add_argument("--metrics-host", default="0.0.0.0", help="address for --metrics-port")
    out.add_argument("--exporter-url", help="read GPU/KV/queue from the exporter during each step")
    out.add_argument("--prometheus-url", help="read GPU/KV/queue from Prometheus after each step")
    out.add_argument(
        "--no-progress", action="store_true", help="plain log lines even on a terminal"
    )


def _load_config(args: argparse.Namespace) -> Config | None:
    if not args.config:
        return None
    try:
        return load_config(args.config)
    except ConfigError as exc:
        raise UsageError(
            f"invalid configuration {args.config}:\n" + "\n".join(f"  - {e}" for e in exc.errors)
        ) from None


def resolve_targets(args: argparse.Namespace, config: Config | None) -> list[Target]:
    """Targets from --engine (config) or --url; raises UsageError when neither fits."""
    if args.url and args.engine:
        raise UsageError("use either --engine NAME (with --config) or --url, not both")
    if args.url:
        if not args.url.startswith(("http://", "https://")):
            raise UsageError(f"--url must start with http:// or https://, got {args.url!r}")
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        return [Target(args.name, args.url.rstrip("/"), args.kind, key, args.model)]
    if not args.engine:
        raise UsageError("no target: give --url URL, or --config FILE with --engine NAME")
    if config is None:
        raise UsageError("--engine needs --config FILE (or env LLMB_CONFIG)")
    if len(set(args.engine)) != len(args.engine):
        raise UsageError("the same --engine is given twice")
    targets = []
    for name in args.engine:
        try:
            engine = config.engine(name)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        targets.append(Target(engine.name, engine.url, engine.kind, engine.api_key(), args.model))
    return targets


def _apply_config_defaults(
    parser: argparse.ArgumentParser, command: str, argv: Sequence[str]
) -> None:
    """Use the config file's `loadgen:` mapping as defaults for the command's flags.

    One `loadgen:` mapping serves every subcommand: a key is applied where the command has
    that flag and ignored by the others; a key that no subcommand knows is an error (typo).
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=os.environ.get("LLMB_CONFIG"))
    known, _ = pre.parse_known_args(argv)
    if not known.config:
        return
    try:
        config = load_config(known.config)
    except ConfigError:
        return  # reported with full detail once the command runs
    if not config.loadgen:
        return
    subparsers = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    every = {a.dest for sub in subparsers.values() for a in sub._actions}
    unknown = sorted(set(config.loadgen) - every)
    if unknown:
        raise UsageError(f"{known.config}: unknown loadgen keys: {', '.join(unknown)}")
    own = {a.dest for a in subparsers[command]._actions}
    subparsers[command].set_defaults(**{k: v for k, v in config.loadgen.items() if k in own})


def _base_spec(args: argparse.Namespace, targets: list[Target]) -> RunSpec:
    if args.requests is not None and args.duration is not None:
        raise UsageError("use --requests or --duration, not both")
    prompt_text = None
    if args.prompt_file is not None:
        try:
            prompt_text = args.prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--prompt-file {args.prompt_file}: {exc.strerror or exc}") from None
        if not prompt_text.strip():
            raise UsageError(f"--prompt-file {args.prompt_file} is empty")
    return RunSpec(
        targets=targets,
        max_tokens=args.max_tokens,
        rate=args.rate,
        arrival=args.arrival,
        requests=args.requests,
        duration=args.duration,
        warmup=args.warmup,
        timeout=args.timeout,
        endpoint=args.endpoint,
        cache=args.cache,
        prompt_text=prompt_text,
        seed=args.seed,
        connect_timeout=args.connect_timeout,
    )


def _options(args: argparse.Namespace, command: str) -> SessionOptions:
    import time

    out = args.out or Path("out") / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    info: dict[str, Any] = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k not in ("func",) and not callable(v)
    }
    info["command"] = command
    return SessionOptions(
        out_dir=out,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        pause=getattr(args, "pause", 0.0),
        probe_factory=probe_factory(args.exporter_url, args.prometheus_url),
        progress=False if args.no_progress else None,
        run_info=info,
    )


def _finish(args: argparse.Namespace, specs: list[RunSpec], command: str) -> int:
    options = _options(args, command)
    workers = getattr(args, "workers", 1)
    if workers > 1:
        from loadgen.workers import execute_workers, worker_count_error

        problem = worker_count_error(specs[0], workers)
        if problem is not None:
            raise UsageError(problem)
        result = asyncio.run(
            execute_workers(
                specs[0],
                options,
                workers,
                (args.exporter_url, args.prometheus_url),
                args.log_level,
            )
        )
    else:
        result = asyncio.run(execute(specs, options))
    if result.error:
        print(f"llmb-loadgen: {result.error}", file=sys.stderr)
    elif options.out_dir is not None:
        print(f"results in {options.out_dir}", file=sys.stderr)
    return result.exit_code


def run_command(args: argparse.Namespace) -> int:
    """`run`: one setting on one or more engines."""
    targets = resolve_targets(args, _load_config(args))
    spec = _base_spec(args, targets)
    spec.concurrency = (
        args.concurrency if args.concurrency is not None else (None if args.rate is not None else 1)
    )
    if spec.prompt_text is None:
        spec.prompt_tokens = args.prompt_tokens or 512
    elif args.prompt_tokens is not None:
        raise UsageError("use --prompt-file or --prompt-tokens, not both")
    return _finish(args, [spec], "run")


def sweep_command(args: argparse.Namespace) -> int:
    """`sweep`: concurrency and prompt-length lists, one variable changed per step."""
    targets = resolve_targets(args, _load_config(args))
    base = _base_spec(args, targets)
    if base.prompt_text is not None and len(args.prompt_tokens) > 1:
        raise UsageError("--prompt-file fixes the prompt; give one --prompt-tokens value or none")
    if base.rate is not None and len(args.concurrency) > 1:
        raise UsageError("--rate is an open loop; sweep --concurrency without --rate")
    specs = plan_steps(base, args.concurrency, args.prompt_tokens, grid=args.grid)
    if base.prompt_text is not None:
        for spec in specs:
            spec.prompt_tokens = None
    return _finish(args, specs, "sweep")


def _configure_run(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    add_load_arguments(parser)
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="worker processes sharing the load, merged into one report (default 1); "
        "use when one process is the bottleneck (docs/loadgen.md)",
    )


def _configure_sweep(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    add_load_arguments(parser, sweep=True)


def default_commands() -> list[Command]:
    """`run`, `sweep`, and any optional command module present."""
    commands = [
        Command("run", "one load setting against one or more engines", _configure_run, run_command),
        Command(
            "sweep",
            "several settings in a row (one variable changed per step)",
            _configure_sweep,
            sweep_command,
        ),
    ]
    for module_name in OPTIONAL_COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            # A missing optional command (or its optional dependency) must not break run/sweep.
            logging.getLogger(__name__).debug("command module %s skipped: %s", module_name, exc)
            continue
        factory = getattr(module, "command", None)
        own_main = getattr(module, "main", None)
        name = module_name.rpartition(".")[2]
        if factory is not None:
            commands.append(factory())
        elif own_main is not None:
            summary = (module.__doc__ or name).strip().splitlines()[0]
            commands.append(Command(name, summary, lambda p: None, lambda a: EXIT_USAGE, own_main))
    return commands


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="llmb-loadgen",
        description="Fixed-prompt load generator for llama.cpp and SGLang with verified token "
        "counts and live Prometheus metrics.",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LLMB_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.configure(p)
        p.set_defaults(func=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 failed, 2 usage, 3 invalid, 130 Ctrl-C)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = default_commands()
    for command in commands:
        if argv and argv[0] == command.name and command.passthrough is not None:
            return int(command.passthrough(argv[1:]))
    parser = build_parser(commands)
    try:
        if argv and argv[0] in {c.name for c in commands}:
            _apply_config_defaults(parser, argv[0], argv[1:])
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"llmb-loadgen: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse exits 2 on bad arguments, 0 on --help
        return int(exc.code or 0)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"llmb-loadgen: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
