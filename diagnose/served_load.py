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
import math
import re
from dataclasses import dataclass
from typing import Any

import httpx

from loadgen.options import UsageError, add_slo_option, http_url, positive_int
from loadgen.prom_api import QueryError, vector_values

RUNNING = "llmb_engine_requests_running"
QUANTILE = 0.9
DEFAULT_WINDOW = "1h"
# Seconds for each query (connect and read): Prometheus answers an instant query in ms.
QUERY_TIMEOUT_S = 10.0
# A p90 of 12.0000001 is 12 requests, not 13 (float noise of the interpolation).
_ROUND_SLACK = 1e-6

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


class LoadQueryError(UsageError):
    """The load could not be read from Prometheus (the message says why and what to pass)."""


def prom_duration(text: str) -> str:
    """A Prometheus duration (`1h`, `30m`, `1h30m`) above zero, for `--load-window`."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text or all(int(n) == 0 for n, _ in parts):
        raise argparse.ArgumentTypeError(
            f"expected a Prometheus duration such as 1h, 30m or 1h30m, got {text!r}"
        )
    return text


@dataclass(frozen=True)
class ServedLoad:
    """The concurrency the answer is for, and where it came from (said beside the answer)."""

    concurrency: int
    source: str


def round_load(p90: float) -> int:
    """Running requests at the p90 as a concurrency: rounded up, at least 1 (idle: c=1)."""
    if not math.isfinite(p90) or p90 < 0:
        raise ValueError(f"not a number of requests: {p90}")
    return max(1, math.ceil(p90 - _ROUND_SLACK))


def _label(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def running_selector(engine: str, window: str) -> str:
    """`llmb_engine_requests_running{engine="NAME"}[1h]`."""
    return f"{RUNNING}{{engine={_label(engine)}}}[{window}]"


def p90_query(engine: str, window: str) -> str:
    """The query whose answer is the user's load (one series per host/instance of the engine)."""
    return f"quantile_over_time({QUANTILE}, {running_selector(engine, window)})"


@dataclass(frozen=True)
class LoadQuery:
    """Where and how to read the served load: `--load-from`, `--load-window`, `--load-engine`."""

    url: str
    window: str = DEFAULT_WINDOW
    # The engine's name in Prometheus (None: the name of the engine in use).
    engine: str | None = None
    timeout: float = QUERY_TIMEOUT_S

    def _query(self, client: httpx.Client, expr: str) -> list[tuple[dict[str, str], float]]:
        where = f"Prometheus at {self.url}"
        try:
            resp = client.get(f"{self.url}/api/v1/query", params={"query": expr})
        except httpx.HTTPError as exc:
            raise LoadQueryError(
                f"--load-from: cannot reach {where} ({type(exc).__name__}: {exc}); "
                "give the Prometheus that scrapes the exporter, or --load N"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            raise LoadQueryError(
                f"--load-from: {self.url}/api/v1/query answered HTTP {resp.status_code} without "
                "Prometheus' JSON: give Prometheus' base URL (http://HOST:9090)"
            ) from None
        try:
            return vector_values(body)
        except QueryError as exc:
            raise LoadQueryError(
                f"--load-from: {where} did not answer {expr!r} (HTTP {resp.status_code}: {exc})"
            ) from None

    def read(self, in_use: str) -> ServedLoad:
        """The p90 of running requests of the engine in use (or `engine`) over the window."""
        engine = self.engine or in_use
        with httpx.Client(timeout=self.timeout) as client:
            found = self._query(client, p90_query(engine, self.window))
            if not found:
                raise LoadQueryError(self._none_found(client, engine))
            found = [(lab, v) for lab, v in found if math.isfinite(v) and v >= 0]
            if not found:
                raise LoadQueryError(
                    f"--load-from: Prometheus at {self.url} answered no number of running "
                    f"requests for {engine!r} over the last {self.window}; pass --load N"
                )
            counts = f"count_over_time({running_selector(engine, self.window)})"
            samples = self._query(client, counts)
        # One series per host or instance serving that engine: the busiest one's load.
        labels, p90 = max(found, key=lambda lv: lv[1])
        count = next((int(v) for lab, v in samples if lab == labels), None)
        series = f", the busiest of {len(found)} series" if len(found) > 1 else ""
        over = f" over {count} samples" if count is not None else ""
        return ServedLoad(
            round_load(p90),
            f"the p90 of running requests over the last {self.window} on {engine} "
            f"({p90:.3g}{over}{series}; Prometheus at {self.url})",
        )

    def _none_found(self, client: httpx.Client, engine: str) -> str:
        """Why the query found nothing: which engines Prometheus does have samples of."""
        expr = f"count by (engine) (count_over_time({RUNNING}[{self.window}]))"
        others = sorted(lab.get("engine", "") for lab, _ in self._query(client, expr))
        head = (
            f"--load-from: Prometheus at {self.url} has no {RUNNING} samples of engine "
            f"{engine!r} in the last {self.window}"
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
            f"({RUNNING}) of the engine in use over --load-window, asked of this Prometheus "
            "(the one scraping the exporter); unreachable or no samples: exit 2",
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
