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

from diagnose import cli as diagnose_cli
from exporter import versioned_parser
from loadgen import cli as loadgen_cli
from loadgen.options import EXIT_USAGE, Command, HelpFormatter, UsageError

__all__ = ["build_parser", "default_commands", "main"]


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 failed, 2 usage, 3 invalid or a `--fail-on`
    verdict, 130 Ctrl-C; docs/loadgen.md "Validity", docs/diagnose.md "Exit codes")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = default_commands()
    parser = build_parser(commands)
    try:
        if argv and argv[0] in {c.name for c in commands}:
            loadgen_cli.apply_config_defaults(parser, argv[0], argv[1:])
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
