"""Typed, forgiving reads of an engine's JSON answers.

Engines change their JSON between builds and a broken or hostile one can send anything. A
collector reads every field through `Fields`: a missing key or `null` is simply "not known";
a present value of the wrong type, a non-finite number or a negative count is "not known"
too, and is also recorded in `problems`, which the collector reports as one
`llmb_source_errors_total{reason="parse"}`. Only the series built from that field is lost;
nothing raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from exporter.schema import finite_number, sanitize_label


def _kind(value: Any) -> str:
    return type(value).__name__


def _is_text(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


class Fields:
    """One JSON object (or an empty one) at `where`, read key by key."""

    def __init__(self, doc: Any, where: str, problems: list[str]):
        self.where = where
        self.problems = problems
        if doc is None or isinstance(doc, dict):
            self.doc: dict[str, Any] = doc or {}
        else:
            self._bad("", "object", doc)
            self.doc = {}

    def __bool__(self) -> bool:
        return bool(self.doc)

    def _bad(self, key: str, expected: str, value: Any) -> None:
        where = f"{self.where}.{key}" if key else self.where
        self.problems.append(f"{where}: expected {expected}, got {_kind(value)}")

    def has(self, key: str) -> bool:
        """The key is present and not null."""
        return self.doc.get(key) is not None

    def obj(self, key: str) -> Fields:
        """The nested object at `key` (empty when absent or of the wrong type)."""
        return Fields(self.doc.get(key), f"{self.where}.{key}", self.problems)

    def objects(self, key: str) -> list[Fields] | None:
        """The list of objects at `key`; None when absent or when it is no list of objects."""
        return objects(self.doc.get(key), f"{self.where}.{key}", self.problems)

    def num(self, key: str, minimum: float | None = 0.0) -> float | None:
        """A finite number (not a bool, not a string), at least `minimum` when given."""
        value = self.doc.get(key)
        if value is None:
            return None
        number = finite_number(value)
        if number is None or (minimum is not None and number < minimum):
            self._bad(
                key, "a finite number" if minimum is None else f"a number >= {minimum:g}", value
            )
            return None
        return number

    def count(self, key: str) -> int | None:
        """A non-negative whole number."""
        number = self.num(key)
        if number is None:
            return None
        if number != int(number):
            self._bad(key, "a whole number", self.doc.get(key))
            return None
        return int(number)

    def _typed(self, key: str, ok: Callable[[Any], bool], expected: str) -> Any:
        """The value at `key` when `ok(value)`; None when absent, or (recorded) when not ok."""
        value = self.doc.get(key)
        if value is None or ok(value):
            return value
        self._bad(key, expected, value)
        return None

    def text(self, key: str) -> str | None:
        """A string (numbers are taken as their text), sanitized for use as a label."""
        value = self._typed(key, _is_text, "a string")
        return None if value is None else sanitize_label(value)

    def flag(self, key: str) -> bool | None:
        """A JSON boolean."""
        flag: bool | None = self._typed(key, lambda value: isinstance(value, bool), "a boolean")
        return flag

    def __iter__(self) -> Iterator[str]:
        return iter(self.doc)


def objects(value: Any, where: str, problems: list[str]) -> list[Fields] | None:
    """A JSON list of objects as Fields; None (and a problem) for anything else."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        problems.append(f"{where}: expected a list of objects, got {_kind(value)}")
        return None
    return [Fields(item, f"{where}[{i}]", problems) for i, item in enumerate(value)]
