"""The interface of a step of the procedure (names and questions: `diagnose.step_table`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from diagnose.decision.model import Step
    from diagnose.engine_run import EngineRun


class ProcedureStep(Protocol):
    """One step of the procedure: measures on the engine run, returns its answer.

    The answer (`diagnose.decision.Step`: question, answer line, whether it shows the
    bottleneck, its numbers) is the step's typed result; the load steps also leave their
    rows in `run.result.rows` and the decision core's verdict in `run.step_verdicts`.
    """

    key: str

    async def measure(self, run: EngineRun) -> Step: ...
