"""The answer within an SLO: each engine's steps against `--slo` and the highest load it serves.

The arithmetic is `core.slo` over the requests each load row wrote (`requests`); `loads`
puts the answer before speed when the SLO tells the engines apart, `diagnose --slo` adds it
for one engine and `--find-max` bisects with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from core.slo import Slo, judge_step, max_concurrency_within
from diagnose.decision.model import Decision, EngineResult, SloAnswer, Step
from diagnose.decision.requests import EngineRequests


def slo_answer(
    slo: Slo, engines: Sequence[EngineResult], reqs: dict[str, EngineRequests]
) -> SloAnswer:
    """Every load row of each engine judged against the SLO from its requests."""
    ans = SloAnswer(slo.text())
    for e in engines:
        steps = []
        for c in sorted(
            {r.concurrency for r in e.ok_rows() if r.step in ("single", "concurrency")}
        ):
            rounds = reqs[e.name].rounds(e, e.at_concurrency(c))
            if rounds:
                steps.append(judge_step(slo, c, rounds))
        ans.steps[e.name] = steps
        ans.max_within[e.name] = max_concurrency_within(steps)
    return ans


def slo_step(slo: SloAnswer) -> Step:
    """The SLO's step of the answer: each engine's highest load within it."""
    return Step(
        "slo",
        f"Which load is served within {slo.slo} (each level judged with 95 % confidence)?",
        slo.text(),
        True,
        {"max_within": dict(slo.max_within)},
    )


def with_slo(
    decision: Decision, engine: EngineResult, reqs: dict[str, EngineRequests], slo: Slo
) -> Decision:
    """diagnose's answer for one engine with --slo, as a new decision: goodput per step, the
    largest load within, and the SLO's step after the others."""
    answer = slo_answer(slo, [engine], reqs)
    return replace(decision, slo=answer, steps=[*decision.steps, slo_step(answer)])
