"""The interface of a step of the procedure, and the steps' names and questions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from diagnose.decision.model import Step
    from diagnose.engine_run import EngineRun

STEPS = ("residency", "single", "concurrency", "kv_pressure", "context")
STEP_QUESTIONS = {
    "residency": "Do the weights fit and stay resident on the GPU?",
    "single": "Single-request decode: how close to the card's limit?",
    "concurrency": "Concurrency: does aggregate throughput grow, do requests queue?",
    "kv_pressure": "KV pressure: do long prompts in every slot fit in the KV cache?",
    "context": "Long context: where does memory give out?",
}


class ProcedureStep(Protocol):
    """One step of the procedure: measures on the engine run, returns its answer.

    The answer (`diagnose.decision.Step`: question, answer line, whether it shows the
    bottleneck, its numbers) is the step's typed result; the load steps also leave their
    rows in `run.result.rows` and the decision core's verdict in `run.step_verdicts`.
    """

    key: str

    async def measure(self, run: EngineRun) -> Step: ...
