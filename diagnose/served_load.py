"""The user's load (`--load N`, or `--load-from PROMETHEUS_URL`): what compare's answer is for.

An exporter keeps no history, so the load the running engine served is asked of the
Prometheus that scrapes it: the p90 of `llmb_engine_requests_running` for the engine in use
over a window (`--load-window`, default 1h), rounded up to whole requests (the concurrency
the engine had to serve 90 % of the time). `--load N` given wins and Prometheus is not asked.
Prometheus unreachable, a failed query, no samples of that engine in the window: a
`LoadQueryError` (a usage error: one message, exit 2) before anything is measured.
`add_answer_arguments` adds these flags, with --slo and --find-max, to each command.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from core import series as llmb
from loadgen.options import UsageError, add_slo_option, http_url, positive_int
from loadgen.prom_api import (
    QUERY_TIMEOUT_S,
    Prometheus,
    prom_duration,
)
from loadgen.served_mix import busiest_running, round_load, running_quantile_query

__all__ = [
    "DEFAULT_WINDOW",
    "QUANTILE",
    "LoadQuery",
    "LoadQueryError",
    "ServedLoad",
    "add_answer_arguments",
    "load_query",
    "p90_query",
    "prom_duration",
    "round_load",
    "user_load",
]

QUANTILE = 0.9
DEFAULT_WINDOW = "1h"


class LoadQueryError(UsageError):
    """The load could not be read from Prometheus (the message says why and what to pass)."""


@dataclass(frozen=True)
class ServedLoad:
    """The concurrency the answer is for, and where it came from (said beside the answer)."""

    concurrency: int
    source: str


def p90_query(engine: str, window: str) -> str:
    """The query whose answer is the user's load (one series per host/instance of the engine)."""
    return running_quantile_query(engine, window, QUANTILE)


@dataclass(frozen=True)
class LoadQuery:
    """Where and how to read the served load: `--load-from`, `--load-window`, `--load-engine`."""

    url: str
    window: str = DEFAULT_WINDOW
    # The engine's name in Prometheus (None: the name of the engine in use).
    engine: str | None = None
    timeout: float = QUERY_TIMEOUT_S

    def read(self, in_use: str) -> ServedLoad:
        """The p90 of running requests of the engine in use (or `engine`) over the window."""
        engine = self.engine or in_use
        prom = Prometheus(self.url, self.timeout)
        with prom.asking(LoadQueryError, "--load-from", "--load N") as client:
            # The quantile and its sample count of one window: both queries at one instant.
            load = busiest_running(prom, client, engine, self.window, QUANTILE, time.time())
            if load is None:
                raise LoadQueryError(
                    self._none_found(
                        prom.engines_with(client, llmb.ENGINE_REQUESTS_RUNNING, self.window), engine
                    )
                )
        series = f", the busiest of {load.series} series" if load.series > 1 else ""
        over = f" over {load.samples} samples" if load.samples is not None else ""
        return ServedLoad(
            round_load(load.value),
            f"the p90 of running requests over the last {self.window} on {engine} "
            f"({load.value:.3g}{over}{series}; Prometheus at {self.url})",
        )

    def _none_found(self, others: list[str], engine: str) -> str:
        """Why the query found nothing: which engines Prometheus does have samples of."""
        head = (
            f"--load-from: Prometheus at {self.url} has no {llmb.ENGINE_REQUESTS_RUNNING} "
            f"samples of engine {engine!r} in the last {self.window}"
        )
        if not others:
            return (
                f"{head}, nor of any engine: is it scraping the exporter (job llmb-exporter)? "
                "Pass --load N instead"
            )
        return (
            f"{head}; it has samples of {', '.join(others)}: pass --load-engine NAME "
            "(the engine you run today), a longer --load-window, or --load N"
        )


def add_answer_arguments(group: Any, *, find_max: bool, load_from: bool) -> None:
    """The flags of what the answer is for: --load and --slo (compare, diagnose and decide);
    with `find_max` --find-max (diagnose and compare: it measures more levels); with
    `load_from` --load-from, --load-window, --load-engine (compare and decide)."""
    group.add_argument(
        "--load",
        type=positive_int,
        metavar="N",
        help="the concurrency you serve: the recommendation is for this load; it wins over "
        "--load-from (compare, decide) (default: the answer at every measured load, the "
        "highest deciding)",
    )
    add_slo_option(group, "goodput per step and the highest load within it")
    if find_max:
        group.add_argument(
            "--find-max",
            action="store_true",
            help="with --slo: measure between the concurrency levels (bisection) for the "
            "highest load within the SLO",
        )
    if load_from:
        group.add_argument(
            "--load-from",
            type=http_url,
            metavar="PROMETHEUS_URL",
            help="without --load: the load is the p90 of running requests "
            f"({llmb.ENGINE_REQUESTS_RUNNING}) of the engine in use over --load-window, asked of "
            "this Prometheus (the one scraping the exporter); unreachable or no samples: exit 2",
        )
        group.add_argument(
            "--load-window",
            type=prom_duration,
            default=DEFAULT_WINDOW,
            metavar="DURATION",
            help="with --load-from: the window of the p90 (a Prometheus duration: 30m, 1h, 1d)",
        )
        group.add_argument(
            "--load-engine",
            metavar="NAME",
            help="with --load-from: the engine's name in Prometheus (its engine label) when it "
            "differs (default: the engine in use, compare's A or decide's --in-use)",
        )


def load_query(args: argparse.Namespace) -> LoadQuery | None:
    """The query the flags ask for (None: no --load-from)."""
    if args.load_from is None:
        if args.load_engine is not None:
            raise UsageError("--load-engine names the engine to read with --load-from: give both")
        return None
    return LoadQuery(args.load_from, args.load_window, args.load_engine)


def user_load(load: int | None, query: LoadQuery | None, in_use: str) -> ServedLoad | None:
    """The load the answer is for: `--load` when given, else Prometheus' (None: neither)."""
    if load is not None:
        return ServedLoad(load, "--load")
    if query is None:
        return None
    return query.read(in_use)
