"""The answer within an SLO: each engine's steps against `--slo` and the highest load it serves.

The arithmetic is `core.slo` over the requests each load row wrote (`requests`); `loads`
puts the answer before speed when the SLO tells the engines apart, `diagnose --slo` adds it
for one engine and `--find-max` bisects with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.slo import Slo, StepSlo, judge_step, max_concurrency_within
from diagnose.decision.model import Decision, EngineResult, Step
from diagnose.decision.requests import EngineRequests


@dataclass
class SloAnswer:
    """Each engine's steps against the user's SLO and the highest load that meets it."""

    slo: str
    steps: dict[str, list[StepSlo]] = field(default_factory=dict)
    max_within: dict[str, int | None] = field(default_factory=dict)

    def meets(self, engine: str, load: int) -> bool:
        """Whether `engine` meets the SLO at `load` (up to its highest load within it)."""
        m = self.max_within.get(engine)
        return m is not None and load <= m

    def text(self) -> str:
        return f"at {self.slo}: " + "; ".join(self.engine_text(e) for e in self.steps)

    def engine_text(self, engine: str) -> str:
        steps = sorted(self.steps[engine], key=lambda s: s.concurrency)
        m = self.max_within[engine]
        fail = next((s for s in steps if m is None or s.concurrency > m), None)
        ok = next((s for s in steps if s.concurrency == m), None)
        head = f"{engine} meets it up to c={m}" if m is not None else f"{engine} does not meet it"
        bits = []
        if ok is not None:
            bits.append(
                _observed(ok) + (f", goodput {ok.goodput_rps:.2f} req/s" if ok.goodput_rps else "")
            )
        if fail is not None:
            why = (
                "not measured: " + ", ".join(fail.unmeasured)
                if fail.met is None
                else _observed(fail)
            )
            bits.append(
                f"{why} at c={fail.concurrency}, {fail.share * 100:.0f} % of requests within"
            )
        return head + (f" ({'; '.join(bits)})" if bits else "")


def _observed(s: StepSlo) -> str:
    return ", ".join(f"{k} {v:.2f} s" for k, v in s.observed.items() if v is not None)


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
        f"Which load is served within {slo.slo}?",
        slo.text(),
        True,
        {"max_within": dict(slo.max_within)},
    )


def add_slo(
    decision: Decision, engine: EngineResult, reqs: dict[str, EngineRequests], slo: Slo
) -> None:
    """diagnose's answer for one engine with --slo: goodput per step, the largest load within."""
    decision.slo = slo_answer(slo, [engine], reqs)
    decision.steps.append(slo_step(decision.slo))
