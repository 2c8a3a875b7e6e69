"""The verdict of one engine, through the decision core, and `diagnose`'s answer.

The verdict is never decided here: `engine_verdict` calls `core.conditions.evaluate`, the evaluator
the Prometheus recording rules are generated from, and only words the action.
"""

from __future__ import annotations

from core.conditions import evaluate
from core.roofline import expert_offload_action, misfit_text, roofline_misfit
from core.signals import Signals
from diagnose.decision.model import (
    FIX_MEMORY_FIRST,
    INCONCLUSIVE,
    STAY_AND_TUNE,
    Decision,
    EngineResult,
    Step,
)
from diagnose.decision.roofline import facts


def engine_verdict(engine: EngineResult, signals: Signals) -> tuple[str, str]:
    """(verdict, action) of the decision core for what was measured on `engine`.

    The physics gate: when the decode efficiency behind the verdict is beyond physics, the
    core claims no decode verdict (the fallback) and the action says why the roofline does
    not fit instead of how to tune decode. Expert offload names its layers, bytes and bound.
    """
    decided = evaluate(signals)
    action = str(decided.action)
    eff = signals.decode_efficiency
    reason = roofline_misfit(eff, facts(engine))
    if reason is not None and eff is not None and decided.name == "decode_below_card_limit":
        action = misfit_text(eff, reason) + "."
    if decided.name == "weights_not_resident" and "experts_host" in decided.evidence:
        action = expert_offload_action(engine.host_offload()) + " " + action
    return str(decided.name), action


def recommendation_for(verdict: str | None) -> str:
    """A single engine's recommendation: fix memory, or stay and tune what the verdict names."""
    if verdict is None or verdict == "idle":
        return INCONCLUSIVE
    if verdict == "weights_not_resident":
        return FIX_MEMORY_FIRST
    return STAY_AND_TUNE


def decide_single(engine: EngineResult, steps: list[Step] | None = None) -> Decision:
    """diagnose's answer: the engine's verdict first, then the action (and the steps)."""
    rec = recommendation_for(engine.verdict)
    action = engine.action or "nothing was measured under load: run diagnose with load steps"
    caveats = max_tokens_caveats(engine) + [f"{engine.name}: {n}" for n in engine.notes]
    return Decision(
        verdict={engine.name: engine.verdict},
        recommendation=rec,
        action=action,
        comparable=True,
        steps=list(steps or []),
        caveats=caveats,
    )


def max_tokens_caveats(engine: EngineResult) -> list[str]:
    # The KV-pressure step cuts requests on purpose where the KV cache runs out.
    bad = [
        r
        for r in engine.rows
        if r.error is None and not r.tokens_ok and r.requests and r.step != "kv_pressure"
    ]
    if bad:
        asked = "the traffic's lengths" if engine.traffic is not None else "max_tokens"
        return [f"{engine.name}: token counts differ from {asked} in {len(bad)} step(s)"]
    return []
