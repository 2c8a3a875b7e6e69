"""The traffic flags' checks and source, shared by `run`, `diagnose` and `compare`
(the flags themselves: `loadgen.options.add_traffic_options`), so `--traffic` means the same
and fails the same in every command."""

from __future__ import annotations

import argparse

from loadgen.options import UsageError
from loadgen.traffic.model import Traffic, TrafficError
from loadgen.traffic.spec import load_traffic, served_traffic


def traffic_given(args: argparse.Namespace) -> bool:
    """Whether `--traffic` or `--traffic-from` was given; a UsageError when the traffic flags
    contradict each other (both sources, a modifier without its source)."""
    if args.traffic is not None and args.traffic_from is not None:
        raise UsageError("--traffic or --traffic-from (the served mix), not both")
    if args.traffic_engine is not None and args.traffic_from is None:
        raise UsageError("--traffic-engine goes with --traffic-from")
    given = args.traffic is not None or args.traffic_from is not None
    if not given and (args.time_scale != 1.0 or args.no_schedule):
        raise UsageError("--time-scale and --no-schedule go with --traffic")
    return given


def read_traffic(args: argparse.Namespace, count: int | None) -> Traffic:
    """The traffic of `--traffic` or `--traffic-from` (`count`: the requests a generated mix
    draws), or a UsageError that names the flag."""
    flag = "--traffic-from" if args.traffic_from else "--traffic"
    try:
        if args.traffic_from:
            window, engine = args.traffic_window, args.traffic_engine
            return served_traffic(args.traffic_from, window, engine, count)
        return load_traffic(args.traffic, count)
    except TrafficError as exc:
        raise UsageError(f"{flag}: {exc}") from None
