"""What a step of the procedure is handed and what it hands back.

A step takes explicit inputs (the measuring seam it calls, the options and facts it reads,
a line sink for its progress) and returns a frozen `StepOutcome`; the procedure
(`diagnose.procedure.Diagnoser`) hands the inputs down, takes the outcomes in one place
(`Diagnoser.apply`) and builds the result from them at the end. Names and questions:
`diagnose.step_table`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from diagnose.decision.model import NOT_MEASURED, Row, Step
from diagnose.step_table import STEP_QUESTIONS
from loadgen.traffic.model import Traffic


@dataclass(frozen=True)
class LoadStep:
    """The load of one procedure step (`key`): sent `rounds` times, one row of the result."""

    key: str
    concurrency: int
    prompt_tokens: int
    rounds: int = 1
    context: int | None = None  # the launch's context (the context sweep), else None
    requests: int | None = None  # None: concurrency x --requests-per-slot
    # --traffic: replay this instead of `prompt_tokens`-long prompts (its own lengths).
    traffic: Traffic | None = None


class StepStopped(Exception):
    """The load stopped before the step's end: Ctrl-C, or the engine went away.

    The step's row (with the rounds that finished) is already among the run's rows; the
    procedure ends here and the run is written as partial.
    """

    def __init__(self, reason: str, interrupted: bool):
        super().__init__(reason)
        self.reason = reason
        self.interrupted = interrupted


# One progress line of the step (the procedure prefixes the engine and the step).
Say = Callable[[str], None]


@dataclass(frozen=True)
class Measured:
    """One load step as measured: its row (recorded among the run's rows as it was measured,
    at `index`, so that a stop keeps it and --find-max reads it) and the decision core's
    verdicts at its end."""

    row: Row
    index: int
    verdicts: tuple[str, ...] = ()


class MeasureLoad(Protocol):
    """Measure one load step in its phase (`load.key`, with `note`) through the scheduler.

    Raises `StepStopped` when the load stopped before its end (its row is recorded)."""

    def __call__(self, load: LoadStep, note: str = "") -> Awaitable[Measured]: ...


@dataclass(frozen=True)
class StepOutcome:
    """What a step hands back, for the procedure to take in (and build the result from).

    `step` is the answer (question, answer line, whether it shows the bottleneck, its
    numbers); `rows` the rows the step made itself (after the measured ones) and `leading`
    those that go ahead of them; `amended` measured rows the step completed, by their index
    among the run's rows; `missing` what it could not measure; `stopped` why the step ended
    early (applied, then the procedure stops).

    The rows a step measures are recorded as they are measured (`MeasureLoad`), not here:
    a stop in the middle of a step keeps them, and --find-max reads them.
    """

    step: Step
    rows: tuple[Row, ...] = ()
    amended: tuple[tuple[int, Row], ...] = ()
    leading: tuple[Row, ...] = ()
    missing: tuple[str, ...] = ()
    stopped: StepStopped | None = None


def not_measured(
    key: str, why: str, say: Say, numbers: dict[str, object] | None = None
) -> StepOutcome:
    """The outcome of a step that could not run: its answer says why, recorded as missing."""
    say(NOT_MEASURED + why)
    return StepOutcome(asked(key, NOT_MEASURED + why, numbers=numbers), missing=(f"{key}: {why}",))


def asked(
    key: str, answer: str, decisive: bool = False, numbers: dict[str, object] | None = None
) -> Step:
    """Step `key`'s answer under its question (`diagnose.step_table`)."""
    return Step(key, STEP_QUESTIONS[key], answer, decisive, numbers or {})


def gib(value: float | None) -> str:
    """Bytes as GiB for the answer lines ('?' when unknown)."""
    return "?" if value is None else f"{value / 2**30:.2f} GiB"


def num(value: float | None) -> str:
    """A count for the answer lines ('?' when unknown)."""
    return "?" if value is None else f"{value:.0f}"
