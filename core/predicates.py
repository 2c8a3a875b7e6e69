"""The condition language: a comparison of one signal with a threshold (`Compare`), all of
several (`AllOf`), one named alternative (`Evidence`), a condition that holds when any of its
alternatives does (`Condition`) and its result (`ConditionResult`).

The decision's table (core/conditions.py) is written in it, `evaluate` reads it there, and the
rules render it to PromQL (mixin/rules/verdict.py). Absence mirrors PromQL: a comparison on an
absent signal is absent, `AllOf` is absent when one part is, an `Evidence` alternative that is
absent does not count, and a condition with every alternative absent is false (the rules'
`or 0 * up`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from core.signals import Signals
from core.thresholds import THRESHOLDS, threshold_number, threshold_promql

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Compare:
    """`signal OP threshold` (PromQL `record OP bool threshold`).

    `threshold` names a `THRESHOLDS` entry or is a number literal. `absent_holds`: an
    absent signal counts as the comparison holding (PromQL `(x OP bool v or up)`).
    """

    signal: str
    op: str
    threshold: str
    absent_holds: bool = False

    @property
    def value(self) -> float:
        """The threshold as a float."""
        return (
            threshold_number(self.threshold)
            if self.threshold in THRESHOLDS
            else float(self.threshold)
        )

    @property
    def promql_threshold(self) -> str:
        """The threshold as PromQL text."""
        return threshold_promql(self.threshold) if self.threshold in THRESHOLDS else self.threshold

    def test(self, signals: Signals) -> bool | None:
        """True/False, or None when the signal is absent."""
        value = getattr(signals, self.signal)
        if value is None:
            return True if self.absent_holds else None
        return _OPS[self.op](float(value), self.value)


@dataclass(frozen=True)
class AllOf:
    """Every comparison holds (PromQL: the `bool` results multiplied); absent if one is."""

    parts: tuple[Compare, ...]

    @classmethod
    def of(cls, *parts: Compare) -> AllOf:
        """All of these comparisons."""
        return cls(parts)

    def test(self, signals: Signals) -> bool | None:
        results = [p.test(signals) for p in self.parts]
        if any(r is None for r in results):
            return None
        return all(results)


@dataclass(frozen=True)
class Evidence:
    """One alternative way a condition can hold, named by its `evidence` label."""

    label: str
    test: Compare | AllOf
    text: str
    # What to do when this alternative holds, where it says more than the verdict's action.
    action: str | None = None


@dataclass(frozen=True)
class Condition:
    """A 0/1 decision input, recorded as `engine:llmb_<name>:bool` for every engine up.

    It holds when any `alternatives` entry holds (absent ones do not count) and, with
    `needs_gpu`, only on a host that has a GPU.
    """

    name: str
    alternatives: tuple[Evidence, ...]
    needs_gpu: bool = False

    @property
    def record(self) -> str:
        """The recorded series name."""
        return f"engine:llmb_{self.name}:bool"

    def evaluate(self, signals: Signals) -> ConditionResult:
        """Which alternatives hold, and whether the condition does."""
        held = tuple(e.label for e in self.alternatives if e.test.test(signals))
        ok = bool(held) and (signals.host_has_gpu or not self.needs_gpu)
        return ConditionResult(self.name, ok, held if ok else ())


@dataclass(frozen=True)
class ConditionResult:
    """One condition evaluated: whether it held and the evidence labels that did."""

    name: str
    held: bool
    evidence: tuple[str, ...]

    @property
    def record(self) -> str:
        """The recorded series name (as `Condition.record`)."""
        return f"engine:llmb_{self.name}:bool"
