"""`--find-max` with `--slo`: the highest concurrency within the SLO, by bisection.

The concurrency step calls it through its --find-max seam (`diagnose.step_inputs`, over
`EngineRun.find_max`: steps import no measuring module).

After the concurrency levels, the highest level that meets the SLO with confidence and the
next measured level above it that misses it with confidence bracket the answer; each probe
measures the midpoint as one more concurrency row, with enough requests to judge the SLO's
percentiles (`core.stats.requests_needed`: 368 for a p99), and keeps the half that holds the
limit, until the two are one request apart, or a probe cannot be judged (the limit lies
within its interval). A level that misses below one that meets is named: the answer is not
monotonic there. The judging is `core.slo` over the requests the rows wrote
(`diagnose.decision.slo.slo_answer`), the same as the answer's SLO step.
"""

from __future__ import annotations

import math

from core.slo import Slo, StepSlo, gaps
from core.stats import requests_needed
from diagnose.decision.requests import load_requests
from diagnose.decision.slo import slo_answer
from diagnose.engine_run import EngineRun
from diagnose.steps.base import LoadStep

# At most this many probes (2^8 = 256 between two levels is more than any sweep needs).
MAX_PROBES = 8


def _steps(run: EngineRun, slo: Slo) -> list[StepSlo]:
    """Every measured level judged against the SLO, so far."""
    so_far = run.view()
    ans = slo_answer(slo, [so_far], load_requests(run.out, [so_far]))
    return sorted(ans.steps[so_far.name], key=lambda s: s.concurrency)


def probe_requests(slo: Slo, concurrency: int, per_slot: int, rounds: int) -> int:
    """Requests per round of a probe: the step's usual count, or more where the SLO's
    percentiles need more to be judged (over all rounds)."""
    needed = max(requests_needed(t.q) for t in slo.terms)
    return max(concurrency * per_slot, math.ceil(needed / max(1, rounds)))


def _not_monotonic(steps: list[StepSlo]) -> str:
    holes = gaps(steps)
    if not holes:
        return ""
    return (
        "; not monotonic: "
        + ", ".join(
            f"c={s.concurrency} {'misses' if s.met is False else 'is not judged'}" for s in holes
        )
        + " below a level that meets it"
    )


async def find_max(run: EngineRun, slo: Slo) -> str:
    """Probe between the measured levels; the line that says what was found."""
    steps = _steps(run, slo)
    met = [s.concurrency for s in steps if s.met is True]
    best = max(met) if met else None
    above = [
        s.concurrency for s in steps if s.met is False and (best is None or s.concurrency > best)
    ]
    if best is None:
        needed = max(requests_needed(t.q) for t in slo.terms)
        if any(s.met is False for s in steps):
            return f"--find-max: no measured load meets {slo.text()} with confidence"
        return (
            f"--find-max: no measured load could be judged against {slo.text()} (it needs "
            f"{needed} requests per level: raise --requests-per-slot or --rounds)"
        )
    if not above:
        return (
            f"--find-max: no measured load above c={best} misses {slo.text()} with confidence "
            "(raise --concurrency)" + _not_monotonic(steps)
        )
    lo, hi = best, min(above)
    probes, unjudged = 0, None
    while hi - lo > 1 and probes < MAX_PROBES:
        mid = (lo + hi) // 2
        n = probe_requests(slo, mid, run.opts.requests_per_slot, run.opts.rounds)
        with run.phase("concurrency", note=f"find-max {mid}"):
            row = await run.load_row(
                LoadStep("concurrency", mid, run.opts.prompt_tokens, run.opts.rounds, requests=n)
            )
        probes += 1
        steps = _steps(run, slo)
        at = next((s for s in steps if s.concurrency == mid), None)
        verdict = None if row.error is not None or at is None else at.met
        if verdict is True:
            lo = mid
        elif verdict is False or row.error is not None:
            hi = mid
        else:
            unjudged = mid
        said = {True: "within", False: "misses", None: "cannot judge"}[verdict]
        run.say("concurrency", f"find-max c={mid}: {said} {slo.text()}")
        if unjudged is not None:
            break
    tail = f"{probes} probe{'s' if probes != 1 else ''} between measured levels"
    if unjudged is not None:
        tail += f"; c={unjudged} could not be judged: the limit lies within its interval"
    return f"highest load within {slo.text()}: c={lo} (c={hi} misses it; {tail})" + _not_monotonic(
        steps
    )
