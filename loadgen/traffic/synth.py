"""Generated traffic: a length mix, shared-prefix groups, multi-turn sessions (seeded)."""

from __future__ import annotations

import random

from loadgen.traffic.mix import LengthMix
from loadgen.traffic.model import UNIQUE_BLOCK_BASE, Traffic, TrafficError, TrafficRequest

# Block ids of generated sources: a group's system prompt, a session's turns.
_GROUP_BASE = 1 << 32
_SESSION_BASE = 1 << 36
MAX_MIX_REQUESTS = 1_000_000


def arrivals(count: int, rate: float | None, seed: int) -> list[float]:
    """Poisson arrival offsets at `rate` per second from 0 (all 0 without a rate)."""
    if rate is None:
        return [0.0] * count
    rng = random.Random(f"arrivals-{seed}")
    out, now = [], 0.0
    for _ in range(count):
        out.append(now)
        now += rng.expovariate(rate)
    return out


def _own(index: int, tokens: int) -> tuple[int, int]:
    return (UNIQUE_BLOCK_BASE + index * 4096, tokens)


def from_mix(mix: LengthMix, name: str, requests: int | None) -> Traffic:
    """`requests` (or the mix's own count) requests drawn from the mix with its seed."""
    count = mix.requests or requests
    if count is None:
        raise TrafficError(f"{name}: the mix gives no request count: add n=N or --requests")
    if count > MAX_MIX_REQUESTS:
        raise TrafficError(f"{name}: {count} requests (at most {MAX_MIX_REQUESTS})")
    rng = random.Random(mix.seed)
    times = arrivals(count, mix.rate_per_second, mix.seed)
    out = []
    for i in range(count):
        prompt = mix.prompt_tokens.sample(rng)
        output = mix.output_tokens.sample(rng)
        out.append(TrafficRequest(times[i], prompt, output, (_own(i, prompt),)))
    width = None if mix.concurrency is None else max(1, round(mix.concurrency))
    return Traffic(name, tuple(out), mix.rate_per_second is not None, width)


def shared_prefix(
    name: str,
    *,
    groups: int,
    prompts: int,
    system: int,
    question: int,
    output: int,
    rate: float | None,
    seed: int,
) -> Traffic:
    """`groups` x `prompts` requests: a group's `system` tokens shared, then its own question.

    The requests of the groups are interleaved in a seeded order, so a group's prompts do not
    all arrive together (the cache must hold the group's prefix between them).
    """
    order = [(g, p) for g in range(groups) for p in range(prompts)]
    random.Random(seed).shuffle(order)
    times = arrivals(len(order), rate, seed)
    out = []
    for i, (group, _) in enumerate(order):
        blocks = ((_GROUP_BASE + group, system), _own(i, question))
        out.append(TrafficRequest(times[i], system + question, output, blocks))
    return Traffic(name, tuple(out), rate is not None)


def sessions(
    name: str,
    *,
    count: int,
    turns: int,
    question: int,
    output: int,
    think_s: float,
    rate: float | None,
    seed: int,
) -> Traffic:
    """`count` conversations of `turns` turns; each turn carries the whole history.

    Turn k's prompt is turn k-1's prompt, a stand-in of the answer's length (the same tokens
    for the same session and turn), then a new `question`-token question: the engine can
    reuse the cached earlier prompt, as it would a real conversation's.
    """
    starts = arrivals(count, rate, seed)
    out = []
    for s in range(count):
        base = _SESSION_BASE + s * 1024
        blocks: tuple[tuple[int, int], ...] = ()
        for turn in range(turns):
            if turn:
                blocks += ((base + 2 * turn - 1, output),)
            blocks += ((base + 2 * turn, question),)
            tokens = sum(n for _, n in blocks)
            think = think_s if turn else 0.0
            out.append(TrafficRequest(starts[s], tokens, output, blocks, f"s{s}", turn, think))
    out.sort(key=lambda r: (r.at_s, r.session or "", r.turn))
    return Traffic(name, tuple(out), rate is not None)
