"""`--find-max` with `--slo`: the highest concurrency within the SLO, by bisection.

The concurrency step calls it through `EngineRun.find_max` (steps import no measuring
module).

After the concurrency levels, the highest level that meets the SLO (with every lower one
meeting it) and the next measured level, which misses it, bracket the answer; each probe
measures the midpoint as one more concurrency row and keeps the half that holds the limit,
until the two are one request apart. The judging is `core.slo` over the requests the rows
wrote (`diagnose.decision.slo.slo_answer`), the same as the answer's SLO step.
"""

from __future__ import annotations

from core.slo import Slo
from diagnose.decision.requests import load_requests
from diagnose.decision.slo import slo_answer
from diagnose.engine_run import EngineRun, LoadStep

# At most this many probes (2^8 = 256 between two levels is more than any sweep needs).
MAX_PROBES = 8


def _judged(run: EngineRun, slo: Slo) -> tuple[int | None, list[int]]:
    """The highest concurrency within the SLO and the levels that miss it, so far."""
    ans = slo_answer(slo, [run.result], load_requests(run.out, [run.result]))
    best = ans.max_within[run.result.name]
    missed = [s.concurrency for s in ans.steps[run.result.name] if s.met is not True]
    return best, missed


async def find_max(run: EngineRun, slo: Slo) -> str:
    """Probe between the measured levels; the line that says what was found."""
    best, missed = _judged(run, slo)
    above = sorted(c for c in missed if best is None or c > best)
    if best is None:
        return f"--find-max: the lowest measured load already misses {slo.text()}"
    if not above:
        return f"--find-max: every measured load is within {slo.text()} (raise --concurrency)"
    lo, hi = best, above[0]
    probes = 0
    while hi - lo > 1 and probes < MAX_PROBES:
        mid = (lo + hi) // 2
        with run.phase("concurrency", note=f"find-max {mid}"):
            row = await run.load_row(
                LoadStep("concurrency", mid, run.opts.prompt_tokens, run.opts.rounds)
            )
        probes += 1
        new_best, _ = _judged(run, slo)
        if row.error is None and new_best is not None and new_best >= mid:
            lo = mid
        else:
            hi = mid
        verdict = "within" if lo == mid else "misses"
        run.say("concurrency", f"find-max c={mid}: {verdict} {slo.text()}")
    return (
        f"highest load within {slo.text()}: c={lo} (c={hi} misses it; {probes} probe"
        f"{'s' if probes != 1 else ''} between measured levels)"
    )
