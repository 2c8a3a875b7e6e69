"""The answer per load: who is ahead at each measured concurrency, where it changes, the
engine for the user's load, and the highest load each engine serves within an SLO.

At every concurrency both engines ran, one call decides (the seed's order): at 1,
single-request decode (aggregate tok/s when a decode rate is missing); above 1, aggregate
tok/s under that load. The crossover is the first concurrency at which the other engine is
ahead. `recommend` names the engine for the user's load (`--load N`), and `switch` only when
the candidate is ahead there and nothing earlier in the order fails (it fits, and its memory
does not give out first at long context); with an SLO, an engine that misses it at that
load loses to one that meets it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from diagnose.decision.calls import Call
from diagnose.decision.model import (
    INCONCLUSIVE,
    STAY,
    STAY_AND_TUNE,
    EngineResult,
    LoadAnswer,
    SloAnswer,
    switch_to,
)


def level_answers(calls: Sequence[Call]) -> list[LoadAnswer]:
    """One answer per concurrency from its deciding call (in the order given: first wins)."""
    out: dict[int, LoadAnswer] = {}
    for x in calls:
        c = x.concurrency or 1
        if c not in out:
            out[c] = LoadAnswer(
                c,
                x.what,
                x.winner,
                x.lead(),
                x.a,
                x.b,
                x.basis,
                x.ratio_lo,
                x.ratio_hi,
                x.decidable,
                x.beside,
            )
    return [out[c] for c in sorted(out)]


def crossover_range(levels: Sequence[LoadAnswer]) -> tuple[int, int] | None:
    """Where the answer changes: (the level before, the first level) at which an engine is
    ahead that was not at the first level compared (no difference counts as an answer there;
    levels too small to call are skipped). The crossover lies between the two."""
    called = [lv for lv in levels if lv.decidable]
    if not called:
        return None
    first = called[0].winner
    for before, lv in itertools.pairwise(called):
        if lv.winner is not None and lv.winner != first:
            return before.concurrency, lv.concurrency
    return None


def crossover(levels: Sequence[LoadAnswer]) -> int | None:
    """The first measured level of the crossover range (`Decision.crossover`)."""
    found = crossover_range(levels)
    return found[1] if found else None


def _level_text(lv: LoadAnswer, at: str = "") -> str:
    # The whole request's parts come last, after the figure and its ratio.
    beside = f"; {lv.beside}" if lv.beside else ""
    if lv.winner is None and lv.ratio_lo is not None and lv.ratio_hi is not None:
        return (
            f"no difference beyond the noise ({lv.what} {lv.a:.3g} vs {lv.b:.3g}{at}, ratio "
            f"[{lv.ratio_lo:.2f}–{lv.ratio_hi:.2f}]{beside})"
        )
    if lv.winner is None and lv.decidable:
        return (
            f"no difference beyond the noise ({lv.what} {lv.a:.3g} vs {lv.b:.3g}{at}: "
            f"{lv.basis}{beside})"
        )
    if lv.winner is None:
        return f"not decided ({lv.what} {lv.a:.3g} vs {lv.b:.3g}{at}: {lv.basis}{beside})"
    return f"{lv.winner} ahead ({lv.lead} {lv.what}{at}{beside})"


def per_load_text(levels: Sequence[LoadAnswer]) -> str:
    """`c=1: llama ahead (+16 % [12–20] ...); c=4: no difference beyond the noise (...); ...`:
    every measured level with its own ratio."""
    return "; ".join(f"c={lv.concurrency}: {_level_text(lv)}" for lv in levels)


def _short(lv: LoadAnswer) -> str:
    """`c=16: sglang ahead 2.5× [2.2–2.8]`, `c=4: no difference, ratio [0.97–1.08]`."""
    if lv.winner is not None:
        return f"c={lv.concurrency}: {lv.winner} ahead {lv.lead}"
    if not lv.decidable:
        return f"c={lv.concurrency}: not decided"
    if lv.ratio_lo is not None and lv.ratio_hi is not None:
        return f"c={lv.concurrency}: no difference, ratio [{lv.ratio_lo:.2f}–{lv.ratio_hi:.2f}]"
    return f"c={lv.concurrency}: no difference"


def answer_at(levels: Sequence[LoadAnswer], load: int) -> tuple[LoadAnswer | None, str]:
    """The answer at the user's load: the level measured there, or the two levels it lies
    between when they agree (each with its ratio); None with the reason when they do not
    (measure at that load)."""
    if not levels:
        return None, "nothing was measured on both engines under the same load"
    by_c = {lv.concurrency: lv for lv in levels}
    if load in by_c:
        return by_c[load], f"at c={load}"
    below = [lv for lv in levels if lv.concurrency < load]
    above = [lv for lv in levels if lv.concurrency > load]
    if not above:
        return below[
            -1
        ], f"at c={load} (above the highest measured load, c={below[-1].concurrency})"
    if not below:
        return above[0], f"at c={load} (below the lowest measured load, c={above[0].concurrency})"
    lo, hi = below[-1], above[0]
    between = f"between {_short(lo)} and {_short(hi)}"
    if lo.winner == hi.winner and lo.decidable and hi.decidable:
        return hi, f"at c={load} ({between}, which agree)"
    return None, f"the answer changes at c={load}, {between}: measure at c={load}"


def recommend(
    a: EngineResult,
    b: EngineResult,
    levels: Sequence[LoadAnswer],
    ctx_winner: str | None,
    load: int | None,
    slo: SloAnswer | None,
) -> tuple[str, str]:
    """The recommendation and its action for the user's load (or for every load)."""
    per_load = per_load_text(levels)
    if slo is not None:
        by_slo = _by_slo(a, b, slo, load)
        if by_slo is not None:
            return _finish(
                a,
                b,
                by_slo[0],
                by_slo[1] + (f"; speed per load: {per_load}" if per_load else ""),
                ctx_winner,
            )
    if load is None:
        if not levels:
            if ctx_winner:
                return _finish(a, b, ctx_winner, "its memory lasts longer at long context", None)
            return INCONCLUSIVE, "nothing was measured on both engines under the same load"
        # No load given: the highest measured load decides; the answer per load says the rest.
        decided = [lv for lv in levels if lv.winner]
        if not decided:
            return _no_difference(a, b, levels, ctx_winner, per_load)
        lv = decided[-1]
        where = f"at c={lv.concurrency}, the highest load where one is ahead"
        tail = (
            f". Per load: {per_load}; pass --load N (or --load-from PROMETHEUS_URL) for the "
            "answer at your load"
        )
    else:
        found, where = answer_at(levels, load)
        if found is None:
            return INCONCLUSIVE, where + f". Per load: {per_load}"
        lv = found
        tail = f". Per load: {per_load}"
    if lv.winner is None:
        if not lv.decidable:
            return INCONCLUSIVE, f"{where}: {_level_text(lv)}{tail}"
        same = (
            f"no difference beyond the noise {where} ({lv.what}: {a.name} {lv.a:.3g}, "
            f"{b.name} {lv.b:.3g})"
        )
        if ctx_winner:
            # Equal speed: the last question of the order decides.
            return _finish(
                a, b, ctx_winner, f"{same}, and its memory lasts longer at long context{tail}", None
            )
        return STAY, f"stay on {a.name}: {same}{tail}"
    parts = f" ({lv.beside})" if lv.beside else ""
    # Between two levels, `where` gives the lead at both (the upper one alone overstates it).
    lead = f"{lv.lead} {lv.what}{parts}" if "between" not in where else f"{lv.what} at both"
    return _finish(a, b, lv.winner, f"{where}: {lv.winner} ahead, {lead}{tail}", ctx_winner)


def _no_difference(
    a: EngineResult,
    b: EngineResult,
    levels: Sequence[LoadAnswer],
    ctx_winner: str | None,
    per_load: str,
) -> tuple[str, str]:
    """No load given and no level with a winner: `stay` (the engine in use), unless a level
    could not be called at all (too few samples: inconclusive, naming it) or long context
    decides."""
    called = [lv for lv in levels if lv.decidable]
    undecided = [lv for lv in levels if not lv.decidable]
    if undecided:
        why = "; ".join(f"c={lv.concurrency}: {_level_text(lv)}" for lv in undecided)
        return INCONCLUSIVE, f"too few samples to call a difference ({why}). Per load: {per_load}"
    where = "at " + ", ".join(f"c={lv.concurrency}" for lv in called)
    same = f"no difference beyond the noise {where}"
    if ctx_winner:
        return _finish(
            a, b, ctx_winner, f"{same}, and its memory lasts longer at long context", None
        )
    return STAY, f"stay on {a.name}: {same}. Per load: {per_load}"


def _by_slo(
    a: EngineResult, b: EngineResult, slo: SloAnswer, load: int | None
) -> tuple[str, str] | None:
    """The engine the SLO picks (None: the SLO does not tell them apart). One engine wins
    only where it meets the SLO and the other misses it, both with confidence."""
    if load is not None:
        ja, jb = slo.judged(a.name, load), slo.judged(b.name, load)
        for who, mine, other in ((b.name, jb, ja), (a.name, ja, jb)):
            if mine is True and other is False:
                return who, f"at c={load} only {who} meets the SLO ({slo.text()})"
        return None
    ma, mb = slo.max_within.get(a.name), slo.max_within.get(b.name)
    for who, top, low, name in ((b.name, mb, ma, a.name), (a.name, ma, mb, b.name)):
        if top is not None and (low is None or top > low) and slo.judged(name, top) is False:
            return who, (
                f"at your SLO, {b.name} serves up to {mb or 0} concurrent requests, "
                f"{a.name} {ma or 0}, and {name} misses it at c={top} ({slo.text()})"
            )
    return None


def _finish(
    a: EngineResult, b: EngineResult, winner: str, why: str, ctx_winner: str | None
) -> tuple[str, str]:
    """`switch` only when nothing earlier in the order fails: the candidate's memory must not
    give out first at long context."""
    if winner == b.name:
        if ctx_winner == a.name:
            return STAY_AND_TUNE, (
                f"stay on {a.name}: {b.name} is ahead ({why}) but its memory gives out first at "
                f"long context. {a.action}".rstrip(". ")
            )
        return switch_to(b.name), f"switch to {b.name}: {why}"
    return STAY_AND_TUNE, f"stay on {a.name} and tune: {why}. {a.action}".rstrip(". ")
