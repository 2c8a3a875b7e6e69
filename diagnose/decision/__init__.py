"""What `diagnose` and `compare` measured, and the answer they give from it.

Modules: `model` (the typed results shared by the terminal output, `results.json`,
`report.md` and `report.html`), `roofline` (the card's decode limit per engine and step),
`single` (an engine's verdict and `diagnose`'s answer), `compare` (two engines side by
side and the recommendation), `results` (the results.json document and the way back).

The verdict of each engine is never decided here: `single.engine_verdict` builds nothing
of its own and calls `core.evaluate`, the same evaluator the Prometheus recording rules
are generated from. What is decided here is only what the rules cannot see: the
comparison of two engines (comparability, batching at equal load, long context, spread
over rounds) and the recommendation.
"""

from diagnose.decision.compare import (
    MIN_DIFFERENCE,
    PRECISION_TOLERANCE,
    Call,
    comparability,
    decide_compare,
    estimates,
    failed_contexts,
    max_context_loaded,
)
from diagnose.decision.model import (
    FIX_MEMORY_FIRST,
    INCONCLUSIVE,
    NOT_MEASURED,
    STAY_AND_TUNE,
    SWITCH_TO,
    Decision,
    EngineResult,
    Estimate,
    Phase,
    Roofline,
    Row,
    RunInfo,
    Step,
    relative_spread,
    switch_to,
    utc_now,
)
from diagnose.decision.results import engine_from_dict, results_to_dict
from diagnose.decision.roofline import (
    bytes_per_step,
    facts,
    roofline,
    roofline_fraction,
    roofline_text,
    roofline_tok_s,
    row_batch,
    row_roofline,
    row_roofline_text,
)
from diagnose.decision.single import (
    decide_single,
    engine_verdict,
    recommendation_for,
    token_caveats,
)

__all__ = [
    "FIX_MEMORY_FIRST",
    "INCONCLUSIVE",
    "MIN_DIFFERENCE",
    "NOT_MEASURED",
    "PRECISION_TOLERANCE",
    "STAY_AND_TUNE",
    "SWITCH_TO",
    "Call",
    "Decision",
    "EngineResult",
    "Estimate",
    "Phase",
    "Roofline",
    "Row",
    "RunInfo",
    "Step",
    "bytes_per_step",
    "comparability",
    "decide_compare",
    "decide_single",
    "engine_from_dict",
    "engine_verdict",
    "estimates",
    "facts",
    "failed_contexts",
    "max_context_loaded",
    "recommendation_for",
    "relative_spread",
    "results_to_dict",
    "roofline",
    "roofline_fraction",
    "roofline_text",
    "roofline_tok_s",
    "row_batch",
    "row_roofline",
    "row_roofline_text",
    "switch_to",
    "token_caveats",
    "utc_now",
]
