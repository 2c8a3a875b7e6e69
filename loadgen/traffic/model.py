"""The traffic a run replays: a deterministic list of requests, each with its arrival time,
its lengths, the blocks its prompt is made of (equal block ids give equal text, so an engine
can cache the shared prefix) and its place in a multi-turn session."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

# Mooncake's hash_ids cover the prompt in blocks of this many tokens.
MOONCAKE_BLOCK_TOKENS = 512
# Block ids of prompt parts no other request shares (a mix's prompt, a question, an answer
# stand-in) start here, far above any trace's own ids.
UNIQUE_BLOCK_BASE = 1 << 40
# Every block id of a source is below 2**44 (warm-up prompts use ids from there): round r of a
# step moves them by r << ROUND_SHIFT, so no two rounds share a block (`Traffic.for_round`).
ROUND_SHIFT = 48


class TrafficError(ValueError):
    """A traffic source that cannot be read or used; the message says where and why."""


@dataclass(frozen=True)
class TrafficRequest:
    """One request of the traffic.

    `blocks` are (block id, tokens) in prompt order; their tokens sum to `prompt_tokens`.
    A session's first turn is sent at `at_s`; a later turn `think_s` after the answer to
    the one before it (and not before its own `at_s`).
    """

    at_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[tuple[int, int], ...]
    session: str | None = None
    turn: int = 0
    think_s: float = 0.0


@dataclass(frozen=True)
class Traffic:
    """The requests of a `--traffic` source, in send order (request index = position)."""

    source: str
    requests: tuple[TrafficRequest, ...]
    # Arrival times are meant (a trace, a mix with a rate); False: a closed loop's order.
    scheduled: bool = True
    # A mix's own closed-loop width (`concurrency`), used when the run gives none.
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.requests:
            raise TrafficError(f"{self.source}: no requests")

    def head(self, count: int | None) -> Traffic:
        """The first `count` requests (all when None); a session keeps its leading turns
        (a turn whose turn before is not kept is left out: it would go without its history)."""
        if count is None or count >= len(self.requests):
            return self
        kept: list[TrafficRequest] = []
        turns: dict[str, int] = {}
        for req in self.requests:
            if len(kept) == count:
                break
            if req.session is not None:
                if req.turn != turns.get(req.session, 0):
                    continue
                turns[req.session] = req.turn + 1
            kept.append(req)
        return dataclasses.replace(self, requests=tuple(kept))

    def for_round(self, round_no: int) -> Traffic:
        """The same traffic with other text for round `round_no` of a step (0: itself).

        Every block id moves by the round's salt: blocks shared within the round stay shared,
        and none is shared with another round, so a later round is not served from the cache
        an earlier one filled. Each block keeps its length, so the prompts stay token-exact.
        """
        if round_no == 0:
            return self
        salt = round_no << ROUND_SHIFT
        requests = tuple(
            dataclasses.replace(r, blocks=tuple((b + salt, n) for b, n in r.blocks))
            for r in self.requests
        )
        return dataclasses.replace(self, requests=requests)

    def span_s(self) -> float:
        """Seconds from the first arrival to the last."""
        times = [r.at_s for r in self.requests]
        return max(times) - min(times)

    def arrival_times(self) -> list[float]:
        """The arrivals the traffic fixes: each request outside a session and each session's
        first turn (a later turn comes when the answer before it has, plus its think time;
        its `at_s` is only a bound, so it is no arrival of its own)."""
        return [r.at_s for r in self.requests if r.session is None or r.turn == 0]

    def sessions(self) -> dict[str, list[int]]:
        """Each session's request indexes, in turn order."""
        out: dict[str, list[int]] = {}
        for index, req in enumerate(self.requests):
            if req.session is not None:
                out.setdefault(req.session, []).append(index)
        for indexes in out.values():
            indexes.sort(key=lambda i: (self.requests[i].turn, i))
        return out

    def shared_prefix_share(self) -> float:
        """Share of all prompt tokens in blocks an earlier request already sent (0-1)."""
        seen: set[int] = set()
        shared = total = 0
        for req in self.requests:
            for block, tokens in req.blocks:
                total += tokens
                if block in seen:
                    shared += tokens
                seen.add(block)
        return shared / total if total else 0.0

    def describe(self, time_scale: float = 1.0) -> dict[str, object]:
        """The mix in numbers (summary.json's `traffic`): lengths, arrivals and their rate
        (a session once), shared share; the span and rate as replayed at `time_scale`
        (`--time-scale`: every time multiplied by it)."""
        prompts = [r.prompt_tokens for r in self.requests]
        outputs = [r.output_tokens for r in self.requests]
        arrivals = self.arrival_times()
        arrivals_span = (max(arrivals) - min(arrivals)) * time_scale
        return {
            "source": self.source,
            "requests": len(self.requests),
            "scheduled": self.scheduled,
            "time_scale": time_scale,
            "span_s": round(self.span_s() * time_scale, 6),
            # Sessions count once each, at their first turn (`arrival_times`).
            "arrivals": len(arrivals),
            "rate_per_s": (
                round((len(arrivals) - 1) / arrivals_span, 6) if arrivals_span > 0 else None
            ),
            "sessions": len(self.sessions()),
            "prompt_tokens": _quantiles(prompts),
            "output_tokens": _quantiles(outputs),
            "shared_prefix_share": round(self.shared_prefix_share(), 6),
        }


def _quantiles(values: Iterable[int]) -> dict[str, float]:
    data = sorted(values)
    n = len(data)

    def at(q: float) -> float:
        return float(data[min(n - 1, int(q * n))])

    return {
        "min": float(data[0]),
        "p50": at(0.5),
        "p90": at(0.9),
        "max": float(data[-1]),
        "mean": round(sum(data) / n, 3),
    }


def split_blocks(ids: Iterable[int], tokens: int, block: int) -> tuple[tuple[int, int], ...]:
    """`tokens` prompt tokens over the block ids, `block` tokens each (the last one shorter)."""
    out = []
    left = tokens
    for block_id in ids:
        if left <= 0:
            break
        take = min(block, left)
        out.append((block_id, take))
        left -= take
    return tuple(out)
