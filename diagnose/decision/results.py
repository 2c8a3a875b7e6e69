"""results.json: the answer first, then every number; and the way back."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from diagnose.decision.model import (
    Decision,
    EngineResult,
    PhaseMark,
    Prefill,
    Roofline,
    Row,
    RunInfo,
)
from loadgen.traffic.summary import TrafficMix


def results_to_dict(
    engines: list[EngineResult], decision: Decision, run: RunInfo | None = None
) -> dict[str, Any]:
    """The results.json document: the answer first, then every number."""
    doc: dict[str, Any] = {
        "verdict": decision.verdict,
        "recommendation": decision.recommendation,
        "action": decision.action,
        "comparable": decision.comparable,
        "caveats": decision.caveats,
    }
    if run is not None:
        doc.update(asdict(run))
    doc["decision"] = decision.to_dict()
    # Each engine opens with its name and kind (its model structure fields, inherited, come
    # first in field order).
    doc["engines"] = [{"name": e.name, "kind": e.kind} | asdict(e) for e in engines]
    return doc


def engine_from_dict(data: dict[str, Any]) -> EngineResult:
    """Rebuild an EngineResult from its results.json form."""
    data = dict(data)
    phases = [PhaseMark(**p) for p in data.pop("phases", [])]
    rows = [Row(**r) for r in data.pop("rows", [])]
    roof = Roofline(**(data.pop("roofline", None) or {}))
    data["prefill"] = Prefill(**(data.pop("prefill", None) or {}))
    timeline = [(float(t), float(v)) for t, v in data.pop("timeline", [])]
    traffic = data.pop("traffic", None)
    data["traffic"] = TrafficMix.from_dict(traffic) if traffic else None
    return EngineResult(**data, phases=phases, rows=rows, roofline=roof, timeline=timeline)
