"""What every command line of the project shares: the `--log-level` option and log setup.

`llmb-exporter` uses it, and any other command (`llmb-loadgen`, ...) can, so the option,
its environment variable and the log format are the same everywhere.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterable

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_log_level_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--log-level` (default: env LLMB_LOG_LEVEL, else INFO) with the help text `help`."""
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LLMB_LOG_LEVEL", "INFO"),
        choices=list(LOG_LEVELS),
        help=help,
    )


def setup_logging(level: str, quiet: Iterable[str] = ("httpx",)) -> None:
    """Log to stderr at `level`. Unless it is DEBUG, the loggers in `quiet` say only
    warnings: one line per engine request would drown the tool's own messages."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
    if level != "DEBUG":
        for name in quiet:
            logging.getLogger(name).setLevel(logging.WARNING)
