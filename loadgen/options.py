"""Command-line options shared by `run`, `sweep`, `diagnose` and `compare`.

One definition per option, so a flag has the same name, type, default and meaning in every
subcommand: `--concurrency` is always a list (`1,2,4`), `--engine` can be repeated, the
per-request limit is `--timeout`, and `--exporter-url` is accepted with or without `/metrics`
(the parsed value is always the exporter's base URL; `metrics_url()` appends the path).
Subparsers use `HelpFormatter`, which shows every default in `--help`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from config.kinds import GENERIC, target_kinds
from config.settings import config_file_from_env
from core.slo import Slo, parse_slo
from loadgen.prom_api import prom_duration

N = TypeVar("N", int, float)
# Where an option is added: a parser or one of its argument groups.
Parser = argparse.ArgumentParser | argparse._ArgumentGroup

# Exit codes of every subcommand.
EXIT_OK = 0
EXIT_FAILED = 1  # target unreachable, calibration impossible, run aborted
EXIT_USAGE = 2  # invalid arguments or configuration
EXIT_INVALID = 3  # the run finished but a step is invalid (failed requests, token mismatch)
EXIT_INTERRUPTED = 130

DEFAULT_METRICS_PORT = 9491
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_MAX_TOKENS = 128


class UsageError(Exception):
    """Invalid arguments or configuration (exit code 2, one message, no traceback)."""


@dataclass(frozen=True)
class Command:
    """A subcommand: adds its arguments to a subparser and runs with the parsed namespace."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows `(default: X)` after every option that has a meaningful default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        # Identity checks: a default of 0 (== False) is a real default and is shown.
        if "%(default)" in text or default is None or default is False or default == []:
            return text
        if default is argparse.SUPPRESS or "(default" in text:
            return text
        if not action.option_strings:
            return text
        if isinstance(default, list):
            shown = ",".join(str(v) for v in default)
            return f"{text} (default: {shown})"
        return f"{text} (default: %(default)s)"


# -- value parsers ---------------------------------------------------------------------------


def _checked(
    convert: Callable[[str], N], invalid: str, ok: Callable[[N], bool], out_of_range: str
) -> Callable[[str], N]:
    """A value parser: `convert`, then `ok`; the messages are templates of `text`/`value`."""

    def parse(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(invalid.format(text=text)) from None
        if not ok(value):
            raise argparse.ArgumentTypeError(out_of_range.format(text=text, value=value))
        return value

    return parse


_INF = float("inf")
positive_int = _checked(
    int, "expected an integer, got {text!r}", lambda v: v >= 1, "must be at least 1, got {value}"
)
positive_int.__doc__ = "An integer of at least 1."
non_negative_int = _checked(
    int, "expected an integer, got {text!r}", lambda v: v >= 0, "must be 0 or more, got {value}"
)
non_negative_int.__doc__ = "An integer of 0 or more."
positive_float = _checked(
    float,
    "expected a number, got {text!r}",
    lambda v: 0 < v < _INF,
    "must be a positive finite number, got {text}",
)
positive_float.__doc__ = "A finite number above 0."
non_negative_float = _checked(
    float,
    "expected a number, got {text!r}",
    lambda v: 0 <= v < _INF,
    "must be 0 or a positive finite number, got {text}",
)
non_negative_float.__doc__ = "A finite number of 0 or more."
share = _checked(
    float,
    "expected a number, got {text!r}",
    lambda v: 0 <= v <= 1,
    "must be a share from 0 to 1, got {text}",
)
share.__doc__ = "A share from 0 to 1 (a ratio, not a count)."
port = _checked(int, "not a port: {text!r}", lambda v: 0 <= v < 65536, "not a port: {text}")
port.__doc__ = "A TCP port number (0 allowed: off / any)."


def int_list(text: str) -> list[int]:
    """Comma-separated positive integers, e.g. `1,2,4,8` (a single `4` is a list of one)."""
    parts = text.split(",")
    # `1,,2` or `1,2,` is a typo, not a shorter list.
    if len(parts) > 1 and any(not part.strip() for part in parts):
        raise argparse.ArgumentTypeError(f"an empty item in the list {text!r}")
    try:
        values = [int(part) for part in parts if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def http_url(text: str) -> str:
    """An http(s) URL without a trailing slash."""
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        raise argparse.ArgumentTypeError(f"must start with http:// or https://, got {text!r}")
    if any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"spaces in URL: {text!r}")
    return text.rstrip("/")


def exporter_url(text: str) -> str:
    """The exporter's base URL; a trailing `/metrics` is accepted and removed."""
    url = http_url(text)
    if url.endswith("/metrics"):
        url = url[: -len("/metrics")].rstrip("/")
    return url


def metrics_url(base: str) -> str:
    """The `/metrics` address of an exporter given with or without the path."""
    return exporter_url(base) + "/metrics"


# -- option groups ---------------------------------------------------------------------------


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """--config/--engine or --url/--name (each repeatable: several engines, in order),
    --kind/--api-key-env/--model."""
    group = parser.add_argument_group("target")
    group.add_argument(
        "--config",
        default=config_file_from_env(),
        help="the exporter's YAML config; engines are then chosen by name (env LLMB_CONFIG_FILE)",
    )
    group.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME",
        help="engine name from the config; repeat for several engines (same prompts)",
    )
    group.add_argument(
        "--url",
        type=http_url,
        action="append",
        help="base URL of an OpenAI-compatible server already running (instead of --engine); "
        "repeat for several engines (same prompts)",
    )
    group.add_argument(
        "--kind",
        choices=target_kinds(),
        default=GENERIC,
        help="server kind with --url (llamacpp enables /tokenize calibration)",
    )
    group.add_argument(
        "--name",
        action="append",
        help="engine label with --url, once per --url in order (default: the model id of "
        "/v1/models)",
    )
    group.add_argument("--api-key-env", help="environment variable holding the API key (--url)")
    group.add_argument("--model", help="model name to send (default: first id of /v1/models)")


def listed(value: Any) -> list[Any]:
    """A repeatable option as a list (a config file's default is one value, not a list)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _add_int_list_option(parser: Parser, flag: str, default: list[int] | None, help: str) -> None:
    parser.add_argument(flag, type=int_list, default=default, metavar="N[,N...]", help=help)


def add_concurrency_option(
    parser: Parser, default: list[int] | None = None, help: str = ""
) -> None:
    """--concurrency as a comma list everywhere (`4` is a list of one)."""
    _add_int_list_option(
        parser,
        "--concurrency",
        default,
        help or "closed loop: requests kept in flight; a list runs one step per value",
    )


def one_value(values: list[int], flag: str) -> int:
    """The one value of a list flag where a command takes one (UsageError otherwise)."""
    if len(values) != 1:
        raise UsageError(f"{flag} takes one value here, not {len(values)}")
    return values[0]


def add_prompt_tokens_option(
    parser: Parser, default: list[int] | None = None, help: str = ""
) -> None:
    """--prompt-tokens as a comma list everywhere."""
    _add_int_list_option(
        parser,
        "--prompt-tokens",
        default,
        help or "prompt length in tokens as counted by the server; a list runs one step each",
    )


def add_timeout_options(parser: Parser) -> None:
    """--timeout (per request, whole stream) and --connect-timeout."""
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="per-request limit in seconds (whole stream)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="S",
        help="connection limit in seconds; an unreachable target fails within about twice this",
    )


def add_max_tokens_option(parser: Parser) -> None:
    """--max-tokens: the exact output length asked of every request."""
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help="output length of every request",
    )


def add_exporter_option(parser: Parser, help: str = "") -> None:
    """--exporter-url, with or without /metrics."""
    parser.add_argument(
        "--exporter-url",
        type=exporter_url,
        metavar="URL",
        help=help
        or "llmb-exporter to read GPU/KV/queue from during each step (with or without /metrics)",
    )


def slo_arg(text: str) -> Slo:
    """argparse type of --slo (a bad term is a usage error naming it)."""
    try:
        slo = parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if any(t.metric == "itl" for t in slo.terms):
        print(ITL_NOTICE, file=sys.stderr)
    return slo


# `itl_pQ` meant each request's own gap before tpot_pQ came (issue 33): said once per use.
ITL_NOTICE = (
    "notice: itl_pQ is now vLLM's ITL, the percentile of every inter-token gap pooled (it "
    "was the percentile over requests of each request's own gap); AIPerf's and GuideLLM's "
    "time per output token is tpot_pQ"
)


_SLO_HELP = (
    "service-level objective, e.g. ttft_p99=2s,tpot_p99=50ms (any of ttft, tpot, itl, e2e at "
    "p50, p90, p99; limits in ms or s): ttft, tpot (each request's mean time per output token "
    "after the first, as AIPerf and GuideLLM) and e2e are percentiles over requests; itl is "
    "the percentile of every inter-token gap pooled, as vLLM"
)


def add_metrics_server_options(parser: Parser, default_port: int = DEFAULT_METRICS_PORT) -> None:
    """--metrics-port / --metrics-host of the load generator's own /metrics (every command)."""
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=default_port,
        metavar="P",
        help="serve live llmb_loadgen_* metrics on this port (0 = off)",
    )
    parser.add_argument(
        "--metrics-host",
        default=DEFAULT_METRICS_HOST,
        metavar="H",
        help="address for --metrics-port (0.0.0.0 exposes it on every interface)",
    )


def add_slo_option(parser: Parser, use: str) -> None:
    """--slo, the same in every command; `use` says what the command does with it."""
    parser.add_argument("--slo", type=slo_arg, metavar="SPEC", help=f"{_SLO_HELP}: {use}")


def add_traffic_options(parser: Parser) -> None:
    """--traffic SPEC, --time-scale, --no-schedule: replay the user's traffic (docs/loadgen.md,
    "Your traffic")."""
    parser.add_argument(
        "--traffic",
        metavar="SPEC",
        help="replay this traffic instead of fixed prompts: a Mooncake trace (.jsonl), an "
        "Azure trace (.csv), a length-mix file (.json), or mix:..., shared-prefix:..., "
        "sessions:... (docs/loadgen.md, 'Your traffic')",
    )
    parser.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        metavar="F",
        help="--traffic: multiply the schedule's times by F (0.5 replays twice as fast)",
    )
    parser.add_argument(
        "--no-schedule",
        action="store_true",
        help="--traffic: ignore arrival times, send as fast as --concurrency allows",
    )
    parser.add_argument(
        "--traffic-from",
        type=http_url,
        metavar="PROMETHEUS_URL",
        help="replay what the engine served, read from the Prometheus that scrapes the "
        "exporter: its length mix at its arrival rate (docs/loadgen.md, 'The served mix from "
        "your Prometheus'); not with --traffic",
    )
    parser.add_argument(
        "--traffic-window",
        type=prom_duration,
        default="1h",
        metavar="DURATION",
        help="--traffic-from: what was served over the last DURATION (30m, 1h, 1d)",
    )
    parser.add_argument(
        "--traffic-engine",
        metavar="NAME",
        help="--traffic-from: the engine's engine label in Prometheus (default: the only "
        "engine it has samples of)",
    )


# What a run writes into its folder: a folder holding one of these is a run already.
RUN_FILES = ("results.json", "summary.json", "requests.jsonl", "requests.jsonl.xz", "report.md")


def out_folder(text: str) -> Path:
    """--out: a folder for a new run, checked before anything is measured.

    Not a file, one that can be made, and not a run already: requests.jsonl is appended to
    as steps finish, so a second run there would mix its requests with the first's (and
    overwrite its answer). The check makes the missing folders and takes them away again.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty name")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if path.is_dir():
        # An empty file is no run: a run that failed before its first request (the target
        # unreachable) opened requests.jsonl, and its retry must not be refused for that.
        kept = [
            name for name in RUN_FILES if (path / name).is_file() and (path / name).stat().st_size
        ]
        if kept:
            raise argparse.ArgumentTypeError(
                f"{text} already holds a run ({', '.join(kept)}); it is kept as it is: "
                "give a new folder"
            )
        try:  # writable, tried: permission bits do not bind root, a read-only mount does
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot write in {text}: {exc.strerror}") from None
        return path
    missing = [path, *(p for p in path.parents if not p.exists())]
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot make {text}: {exc.strerror}") from None
    for made in missing:  # the deepest first
        made.rmdir()
    return path


def add_out_option(parser: Parser, required: bool = False) -> None:
    """--out: the output folder (`out_folder`: new, or empty of a run)."""
    parser.add_argument(
        "--out",
        type=out_folder,
        required=required,
        metavar="DIR",
        help="output folder: a new one, or one that holds no run (a run's folder is kept as "
        "it is)" + ("" if required else " (default: a new out/<command>-<time> per run)"),
    )


__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_USAGE",
    "RUN_FILES",
    "Command",
    "HelpFormatter",
    "UsageError",
    "add_concurrency_option",
    "add_exporter_option",
    "add_max_tokens_option",
    "add_metrics_server_options",
    "add_out_option",
    "add_prompt_tokens_option",
    "add_slo_option",
    "add_target_options",
    "add_timeout_options",
    "add_traffic_options",
    "exporter_url",
    "http_url",
    "int_list",
    "listed",
    "metrics_url",
    "non_negative_float",
    "non_negative_int",
    "one_value",
    "out_folder",
    "port",
    "positive_float",
    "positive_int",
    "share",
]
