"""`llmb-loadgen run|sweep|served-mix|diagnose|compare|decide ...` (`python -m cli.loadgen`).

The composition root of the load generator's command line: it lists the `Command` objects of
`loadgen.cli` (run, sweep, served-mix), `diagnose.cli` (diagnose, compare, decide)
explicitly, so no package imports one above it to register its commands.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from config.settings import ConfigError, config_file_from_env, load_config
from diagnose import cli as diagnose_cli
from exporter import versioned_parser
from loadgen import cli as loadgen_cli
from loadgen.options import EXIT_USAGE, Command, HelpFormatter, UsageError

__all__ = ["apply_config_defaults", "build_parser", "default_commands", "main"]


def default_commands() -> list[Command]:
    """Every subcommand, listed explicitly (an import error is an error, never hidden)."""
    return [
        loadgen_cli.RUN,
        loadgen_cli.SWEEP,
        loadgen_cli.SERVED_MIX,
        diagnose_cli.DIAGNOSE,
        diagnose_cli.COMPARE,
        diagnose_cli.DECIDE,
    ]


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = versioned_parser(
        "llmb-loadgen",
        "Fixed-prompt load generator for llama.cpp and SGLang with verified token counts and "
        "live Prometheus metrics.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LLMB_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (env LLMB_LOG_LEVEL)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            formatter_class=HelpFormatter,
        )
        command.configure(p)
        p.set_defaults(func=command.run)
    return parser


def apply_config_defaults(
    parser: argparse.ArgumentParser, command: str, argv: Sequence[str]
) -> None:
    """Use the config file's `loadgen:` mapping as defaults for the command's flags.

    One `loadgen:` mapping serves every subcommand: a key is applied where the command has
    that flag and ignored by the others; a key that no subcommand knows is an error (typo).
    Here, at the root that lists every command, each value also goes through its flag's
    parser, whichever command owns it (UsageError naming the file and key).
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=config_file_from_env())
    known, _ = pre.parse_known_args(argv)
    if not known.config:
        return
    try:
        config = load_config(known.config)
    except ConfigError:
        return  # reported with full detail once the command runs
    given = config.loadgen.given()  # unknown keys were refused when the file was loaded
    if not given:
        return
    subparsers = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    # Every key through its flag's parser, also the keys other commands take: a value no
    # command accepts is named by its file and key here, not as a flag nobody gave.
    owners: dict[str, argparse.Action] = {}
    for sub in subparsers.values():
        for action in sub._actions:
            owners.setdefault(action.dest, action)
    typed = {a.dest: a for a in subparsers[command]._actions}
    on_line = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    defaults: dict[str, Any] = {}
    for key, value in given.items():
        action = typed.get(key) or owners.get(key)
        if action is None or on_line & set(typed[key].option_strings if key in typed else ()):
            continue  # no flag takes it, or the command line gives it instead
        if action.type is not None and value is not None and not isinstance(value, str):
            # argparse converts a string default with the option's type (and its checks),
            # so `concurrency: 4` and `concurrency: [1, 2]` become the lists the flag gives.
            value = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        if callable(action.type) and isinstance(value, str):
            try:
                action.type(value)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                raise UsageError(f"{known.config}: loadgen.{key}: {exc}") from None
        if key in typed:
            defaults[key] = value
    subparsers[command].set_defaults(**defaults)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 failed, 2 usage, 3 invalid or a `--fail-on`
    verdict, 130 Ctrl-C; docs/loadgen.md "Validity", docs/diagnose.md "Exit codes")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = default_commands()
    parser = build_parser(commands)
    try:
        if argv and argv[0] in {c.name for c in commands}:
            apply_config_defaults(parser, argv[0], argv[1:])
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"llmb-loadgen: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse exits 2 on bad arguments, 0 on --help
        return int(exc.code or 0)
    args.argv = argv
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.log_level != "DEBUG":
        for name in loadgen_cli.QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"llmb-loadgen: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
