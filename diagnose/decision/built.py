"""An engine's result, built once from what its run gathered: the facts, the rows as they
were measured and the procedure's other outputs. The roofline and the prefill figures
follow from the first two, so no reader of the result can see them disagree."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from diagnose.decision.model import EngineResult, Facts, Row, single_row
from diagnose.decision.prefill import prefill_row, row_prefill
from diagnose.decision.roofline import row_roofline


def engine_result(facts: Facts, rows: list[Row], **outputs: Any) -> EngineResult:
    """`facts` and `rows` as an `EngineResult`: the single-request roofline and the
    representative step's prefill taken from them, and `outputs` (the result's other fields:
    missing, notes, evidence, phases, the verdict ...) as given."""
    known = {f.name: getattr(facts, f.name) for f in fields(Facts)}
    known["prefill"] = row_prefill(facts, prefill_row(rows))
    roof = row_roofline(facts, single_row(rows))
    return EngineResult(**known, rows=list(rows), roofline=roof, **outputs)
