"""The load generator's own subcommands, `run`, `sweep` and `served-mix` (`RUN`, `SWEEP`,
`SERVED_MIX`).

The command line that lists them beside diagnose's is `cli.loadgen` (the composition root);
their shared options come from `loadgen.options`, so a flag means the same in every subcommand.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from config.settings import config_file_from_env
from core.slo import Slo
from loadgen.options import (
    Command,
    UsageError,
    add_concurrency_option,
    add_exporter_option,
    add_max_tokens_option,
    add_metrics_server_options,
    add_out_option,
    add_prompt_tokens_option,
    add_slo_option,
    add_target_options,
    add_timeout_options,
    add_traffic_options,
    http_url,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    share,
)
from loadgen.prom_api import instant, prom_duration
from loadgen.prompts import CACHE_MODES
from loadgen.resolve import load_config_or_usage, resolve_targets
from loadgen.scheduler.spec import DEFAULT_REQUESTS, RunSpec
from loadgen.served_mix import DEFAULT_SEED, served_mix
from loadgen.session import MetricsPortBusy, SessionOptions, execute
from loadgen.session import run as run_loop
from loadgen.sweep import plan_steps, probe_factory
from loadgen.target import Target
from loadgen.traffic.flags import read_traffic, traffic_given

__all__ = [
    "QUIET_LOGGERS",
    "RUN",
    "SERVED_MIX",
    "SWEEP",
    "default_out_dir",
]

# The file `served-mix --out FOLDER` writes.
MIX_FILE = "served-mix.json"
# Third-party loggers that would otherwise print their INFO lines between ours.
QUIET_LOGGERS = ("aiohttp.access", "httpx", "httpcore", "matplotlib", "asyncio", "urllib3")


def add_load_arguments(parser: argparse.ArgumentParser, sweep: bool = False) -> None:
    """Load shape, prompt, request and output arguments of `run` and `sweep`."""
    load = parser.add_argument_group("load")
    add_concurrency_option(
        load,
        help="closed loop: requests kept in flight, a list runs one step per value (default 1); "
        "with --rate: cap on requests in flight (default 1024)",
    )
    add_prompt_tokens_option(
        load,
        help="prompt length in tokens, calibrated on the server, a list runs one step per "
        "value (default 512)",
    )
    if sweep:
        load.add_argument(
            "--grid",
            action="store_true",
            help="full product of both lists (consecutive steps still differ in one variable)",
        )
        load.add_argument(
            "--pause", type=non_negative_float, default=10.0, help="seconds between steps"
        )
    _add_arrival_arguments(load)
    load.add_argument(
        "--requests", type=positive_int, help="measured requests per engine and step (default 32)"
    )
    load.add_argument(
        "--duration", type=positive_float, help="seconds per engine and step instead of --requests"
    )
    load.add_argument(
        "--warmup", type=non_negative_int, default=0, help="warm-up requests, not recorded"
    )
    add_timeout_options(load)
    load.add_argument(
        "--max-errors",
        type=share,
        default=0.5,
        metavar="F",
        help="abort the run when more than this share of a step's requests failed "
        "(checked after 8 requests; 0 = abort at the first failure)",
    )
    prompt = parser.add_argument_group("prompt and request")
    prompt.add_argument("--prompt-file", type=Path, help="use this text as the prompt")
    add_max_tokens_option(prompt)
    prompt.add_argument(
        "--endpoint", choices=["chat", "completions"], default="chat", help="API to call"
    )
    prompt.add_argument(
        "--cache",
        choices=CACHE_MODES,
        default="unique",
        help="unique: distinct prefix per request, defeats prompt caches; "
        "same: one identical prompt",
    )
    prompt.add_argument("--seed", type=int, default=1234, help="sampling seed sent")
    out = parser.add_argument_group("output")
    add_out_option(out)
    add_metrics_server_options(out)
    add_slo_option(out, "live goodput series (llmb_loadgen_goodput_*) count the requests within it")
    add_exporter_option(out)
    out.add_argument("--prometheus-url", help="read GPU/KV/queue from Prometheus after each step")
    out.add_argument(
        "--no-progress", action="store_true", help="plain log lines even on a terminal"
    )


def _add_arrival_arguments(load: argparse._ArgumentGroup) -> None:
    """How requests start: open loop (--rate, --arrival) or the closed loop's --ramp-up."""
    load.add_argument(
        "--rate", type=positive_float, help="open loop: requests per second (default: closed loop)"
    )
    load.add_argument(
        "--arrival",
        choices=["poisson", "constant"],
        default="poisson",
        help="open-loop arrival process",
    )
    load.add_argument(
        "--ramp-up",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="closed loop: start the --concurrency workers evenly over this many seconds "
        "instead of all at once (default 0); equal requests keep the spread, so the server "
        "never reads a whole wave at once",
    )


def _base_spec(args: argparse.Namespace, targets: list[Target]) -> RunSpec:
    if args.requests is not None and args.duration is not None:
        raise UsageError("use --requests or --duration, not both")
    if args.ramp_up and args.rate is not None:
        raise UsageError(
            "--ramp-up spreads the closed loop's start; with --rate the arrivals are already "
            "spread (drop one)"
        )
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
        ramp_up=args.ramp_up,
        requests=args.requests,
        duration=args.duration,
        warmup=args.warmup,
        timeout=args.timeout,
        endpoint=args.endpoint,
        cache=args.cache,
        prompt_text=prompt_text,
        seed=args.seed,
        connect_timeout=args.connect_timeout,
        max_error_share=args.max_errors,
    )


def default_out_dir(command: str, root: Path = Path("out")) -> Path:
    """A new folder per run: out/<command>-<local time>, then -2, -3... within one second.

    Under compose, `out` is LOADGEN_OUT_DIR, so each run keeps its own results."""
    base = root / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def _options(args: argparse.Namespace, command: str) -> SessionOptions:
    out = args.out or default_out_dir(command)
    info: dict[str, Any] = {
        k: (str(v) if isinstance(v, Path) else v.text() if isinstance(v, Slo) else v)
        for k, v in vars(args).items()
        if k not in ("func",) and not callable(v)
    }
    info["command"] = command
    info["argv"] = ["llmb-loadgen", *getattr(args, "argv", [])]
    return SessionOptions(
        out_dir=out,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        pause=getattr(args, "pause", 0.0),
        probe_factory=probe_factory(args.exporter_url, args.prometheus_url),
        progress=False if args.no_progress else None,
        run_info=info,
        slo=args.slo,
    )


def _finish(args: argparse.Namespace, specs: list[RunSpec], command: str) -> int:
    try:
        return _execute(args, specs, command)
    except MetricsPortBusy as exc:
        raise UsageError(str(exc)) from None


def _execute(args: argparse.Namespace, specs: list[RunSpec], command: str) -> int:
    options = _options(args, command)
    workers = getattr(args, "workers", 1)
    if workers > 1:
        from loadgen.workers import execute_workers, worker_count_error

        if len(specs) > 1:
            raise UsageError("--workers runs one setting: give one --concurrency value")
        problem = worker_count_error(specs[0], workers)
        if problem is not None:
            raise UsageError(problem)
        result = run_loop(
            execute_workers(
                specs[0],
                options,
                workers,
                (args.exporter_url, args.prometheus_url),
                args.log_level,
            )
        )
    else:
        result = run_loop(execute(specs, options))
    if result.error:
        print(f"llmb-loadgen: {result.error}", file=sys.stderr)
    if options.out_dir is not None and (result.steps or result.summary.aborted):
        print(f"results in {options.out_dir}", file=sys.stderr)
    return result.exit_code


def _steps(args: argparse.Namespace, base: RunSpec, grid: bool) -> list[RunSpec]:
    """The steps of `run`/`sweep`: one per value of the lists, one variable changed at a time."""
    if base.rate is not None and args.concurrency is not None and len(args.concurrency) > 1:
        raise UsageError("--rate is an open loop: give one --concurrency value (the cap)")
    if base.prompt_text is not None:
        if args.prompt_tokens is not None:
            raise UsageError("use --prompt-file or --prompt-tokens, not both")
        prompt_tokens = [0]
    else:
        prompt_tokens = args.prompt_tokens or [512]
    if args.concurrency is not None:
        concurrencies = args.concurrency
    else:
        concurrencies = [0] if base.rate is not None else [1]
    specs = plan_steps(base, concurrencies, prompt_tokens, grid=grid)
    for spec in specs:
        # 0 marks "not given" through plan_steps: no prompt length with --prompt-file, no
        # in-flight cap with --rate.
        if spec.prompt_tokens == 0:
            spec.prompt_tokens = None
        if spec.concurrency == 0:
            spec.concurrency = None
    return specs


def traffic_spec(args: argparse.Namespace, base: RunSpec) -> RunSpec:
    """The one step of `--traffic` or `--traffic-from`: the replayed requests in `base`, or a
    UsageError."""
    flag = "--traffic-from" if args.traffic_from else "--traffic"
    clashes = [
        name
        for name, given in (
            ("--prompt-file", args.prompt_file is not None),
            ("--prompt-tokens", getattr(args, "prompt_tokens", None) is not None),
            ("--rate", getattr(args, "rate", None) is not None),
            ("--ramp-up", bool(getattr(args, "ramp_up", 0))),
            ("--workers", getattr(args, "workers", 1) > 1),
        )
        if given
    ]
    if clashes:
        raise UsageError(
            f"{flag} gives the lengths and times; drop {', '.join(clashes)} "
            "(docs/loadgen.md, 'Your traffic')"
        )
    found = read_traffic(args, base.requests or DEFAULT_REQUESTS)
    traffic = found.head(base.requests)
    concurrency = getattr(args, "concurrency", None)
    if concurrency is not None and len(concurrency) > 1:
        raise UsageError("--traffic runs one step: give one --concurrency value")
    width = concurrency[0] if concurrency else traffic.concurrency
    base.traffic, base.prompt_tokens, base.requests = traffic, None, None
    base.time_scale, base.schedule = args.time_scale, not args.no_schedule
    # Open loop: --concurrency caps the requests in flight (default 1024); closed: the width.
    base.concurrency = width if base.open_loop() else width or 1
    return base


def run_command(args: argparse.Namespace) -> int:
    """`run`: one setting (or one per listed value) on one or more engines."""
    targets = resolve_targets(args, load_config_or_usage(args.config))
    base = _base_spec(args, targets)
    if traffic_given(args):
        spec = traffic_spec(args, base)
        assert spec.traffic is not None
        args.traffic_mix = spec.traffic.describe(spec.time_scale)
        return _finish(args, [spec], "run")
    return _finish(args, _steps(args, base, grid=False), "run")


def sweep_command(args: argparse.Namespace) -> int:
    """`sweep`: concurrency and prompt-length lists, one variable changed per step."""
    targets = resolve_targets(args, load_config_or_usage(args.config))
    base = _base_spec(args, targets)
    return _finish(args, _steps(args, base, grid=args.grid), "sweep")


def _configure_run(parser: argparse.ArgumentParser) -> None:
    add_target_options(parser)
    add_load_arguments(parser)
    add_traffic_options(parser.add_argument_group("traffic (docs/loadgen.md, 'Your traffic')"))
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="worker processes sharing the load, merged into one report; "
        "use when one process is the bottleneck (docs/loadgen.md)",
    )


def _configure_sweep(parser: argparse.ArgumentParser) -> None:
    add_target_options(parser)
    add_load_arguments(parser, sweep=True)


RUN = Command("run", "one load setting against one or more engines", _configure_run, run_command)
SWEEP = Command(
    "sweep",
    "several settings in a row (one variable changed per step)",
    _configure_sweep,
    sweep_command,
)


def _configure_served_mix(parser: argparse.ArgumentParser) -> None:
    # --engine, --out and --seed parse as in the other commands (and take the config file's
    # `loadgen:` keys alike): one engine here, and --out may be a folder.
    parser.add_argument(
        "--config",
        default=config_file_from_env(),
        metavar="FILE",
        help="a config file whose loadgen: keys (prometheus, window, at, engine, seed, out) "
        "are this command's defaults (env LLMB_CONFIG_FILE)",
    )
    parser.add_argument(
        "--prometheus",
        type=http_url,
        metavar="URL",
        help="the Prometheus that scrapes the exporter (http://HOST:9090); required, here or "
        "as the config's loadgen: prometheus",
    )
    parser.add_argument(
        "--window",
        type=prom_duration,
        default="1h",
        metavar="DURATION",
        help="read what the engine served over the DURATION before --at, by default the last "
        "DURATION (a Prometheus duration: 30m, 1h, 1d)",
    )
    parser.add_argument(
        "--at",
        type=instant,
        metavar="TIME",
        help="end the window at TIME, a Unix time in seconds or an RFC 3339 time "
        "(2026-12-07T03:00:00Z) (default: now); every query is evaluated there, so the same "
        "--at reads the same mix again",
    )
    parser.add_argument(
        "--engine",
        action="append",
        metavar="NAME",
        help="the engine's name in Prometheus (its engine label), once (default: the only "
        "engine Prometheus has samples of)",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="the seed written into the mix"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help=f"write the length mix (JSON) here, or into FOLDER/{MIX_FILE} when it is a "
        "folder, and the summary to stdout (default: the JSON to stdout, the summary to stderr)",
    )


def served_mix_command(args: argparse.Namespace) -> int:
    """`served-mix`: the lengths, rate and load an engine served, from Prometheus, as a mix."""
    load_config_or_usage(args.config)  # a missing or bad config file: its own message
    if args.prometheus is None:
        # Not argparse's `required`: the config file's `prometheus` is a default it ignores.
        raise UsageError(
            "served-mix: give --prometheus URL (or the config's loadgen: prometheus), the "
            "Prometheus that scrapes the exporter"
        )
    if args.engine and len(args.engine) > 1:
        raise UsageError("served-mix reads one engine: give --engine once")
    engine = args.engine[0] if args.engine else None
    mix = served_mix(args.prometheus, args.window, engine, seed=args.seed, at=args.at)
    text = mix.length_mix().to_json()
    lines = [f"served mix of {mix.engine} ({mix.kind}) over the {mix.window} ending {mix.ends()}"]
    for what, lengths in (("prompt", mix.prompt), ("output", mix.output)):
        lines.append(f"  {what:<7} mean {lengths.mean:.1f} tokens: {lengths.source}")
    p90 = "-" if mix.running_p90 is None else f"{mix.running_p90:.3g}"
    p50 = "-" if mix.running_p50 is None else f"{mix.running_p50:.3g}"
    lines.append(
        f"  rate    {mix.rate_per_second:.3g} requests/s ({mix.requests:.0f} finished); "
        f"running p50 {p50}, p90 {p90}"
    )
    if mix.cached_share is not None:
        lines.append(f"  cached  {mix.cached_share:.1%} of prompt tokens")
    lines += [f"  lacks   {item}" for item in mix.lacks]
    summary = "\n".join(lines)
    if args.out is None:
        sys.stdout.write(text)
        print(summary, file=sys.stderr)
        return 0
    path = args.out / MIX_FILE if args.out.is_dir() else args.out
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--out {path}: {exc.strerror or exc}") from None
    print(summary)
    print(f"wrote {path}")
    return 0


SERVED_MIX = Command(
    "served-mix",
    "the prompt/output lengths, rate and load an engine served, read from your Prometheus, "
    "as a length mix (JSON)",
    _configure_served_mix,
    served_mix_command,
)
