"""The mix a `--traffic` run sent (results.json's `engines[].traffic`, the report's "Your
traffic"): the length distributions, the arrival rate and the shared-prefix share.

The numbers are the load generator's own (`Traffic.describe`, summary.json's `traffic`);
only the histograms are added here, for the report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadgen.traffic.model import Traffic


@dataclass(frozen=True)
class Lengths:
    """One length distribution of the mix, in tokens: its quantiles and a histogram."""

    min: float
    p50: float
    p90: float
    max: float
    mean: float
    # (upper bound, requests): power-of-two buckets, a request of n tokens in the first
    # bound >= n; empty buckets left out.
    histogram: list[tuple[int, int]] = field(default_factory=list)

    def text(self) -> str:
        """`p50 512, p90 2048 (64–4096)`."""
        return f"p50 {self.p50:.0f}, p90 {self.p90:.0f} ({self.min:.0f}–{self.max:.0f})"


@dataclass(frozen=True)
class TrafficMix:
    """The traffic every engine of the run was sent, and how it was sent."""

    source: str
    requests: int
    # Sent at its arrival times (False: --no-schedule, or a mix without a rate).
    scheduled: bool
    time_scale: float
    # The closed loop's width, or the cap on requests in flight of a scheduled replay.
    concurrency: int
    span_s: float
    # Arrivals per second of the schedule, a session counted once at its first turn (None:
    # one arrival, or no schedule).
    rate_per_s: float | None
    sessions: int
    # Share of all prompt tokens in blocks an earlier request already sent (0-1).
    shared_prefix_share: float
    prompt_tokens: Lengths
    output_tokens: Lengths
    # The arrivals `rate_per_s` counts: requests outside a session, and sessions (None: a
    # results.json from before it was written).
    arrivals: int | None = None

    def rate_text(self) -> str | None:
        """`2 requests/s`, `0.5 sessions/s`, or with both `1 arrivals/s (a session once)`;
        None without a rate."""
        if not self.scheduled or not self.rate_per_s:
            return None
        if not self.sessions:
            return f"{self.rate_per_s:.3g} requests/s"
        if self.arrivals == self.sessions:
            return f"{self.rate_per_s:.3g} sessions/s"
        return f"{self.rate_per_s:.3g} arrivals/s (requests, a session counted once)"

    def text(self) -> str:
        """One line: source, requests, rate, shared share, lengths."""
        rate = self.rate_text() or f"closed loop of {self.concurrency}"
        sessions = f", {self.sessions} sessions" if self.sessions else ""
        return (
            f"{self.source}: {self.requests} requests, {rate}{sessions}, shared prefix "
            f"{self.shared_prefix_share:.0%} of prompt tokens; prompt {self.prompt_tokens.text()}"
            f", output {self.output_tokens.text()} tokens"
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrafficMix:
        """The mix from its results.json form."""
        data = dict(data)
        for key in ("prompt_tokens", "output_tokens"):
            lengths = dict(data[key])
            lengths["histogram"] = [(int(b), int(n)) for b, n in lengths.get("histogram", [])]
            data[key] = Lengths(**lengths)
        return cls(**data)


def histogram(values: Sequence[int]) -> list[tuple[int, int]]:
    """Power-of-two buckets of `values`: (upper bound, count), ascending, none empty."""
    counts = Counter(1 << max(0, (v - 1).bit_length()) for v in values)
    return sorted(counts.items())


def traffic_mix(traffic: Traffic, time_scale: float, schedule: bool, width: int) -> TrafficMix:
    """The mix of `traffic` as the run sends it (`width`: its concurrency)."""
    numbers = traffic.describe()
    scheduled = schedule and traffic.scheduled

    def lengths(key: str, values: list[int]) -> Lengths:
        q = numbers[key]
        assert isinstance(q, dict)
        return Lengths(q["min"], q["p50"], q["p90"], q["max"], q["mean"], histogram(values))

    rate = numbers["rate_per_s"]
    return TrafficMix(
        source=traffic.source,
        requests=len(traffic.requests),
        scheduled=scheduled,
        time_scale=time_scale,
        concurrency=width,
        span_s=float(traffic.span_s()),
        # The schedule's rate as sent: --time-scale stretches the times.
        rate_per_s=float(rate) / time_scale if isinstance(rate, float) and scheduled else None,
        sessions=len(traffic.sessions()),
        arrivals=len(traffic.arrival_times()),
        shared_prefix_share=traffic.shared_prefix_share(),
        prompt_tokens=lengths("prompt_tokens", [r.prompt_tokens for r in traffic.requests]),
        output_tokens=lengths("output_tokens", [r.output_tokens for r in traffic.requests]),
    )
