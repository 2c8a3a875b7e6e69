"""What the engine's own endpoints say (model, precision, slots, contexts), from its one probe.

A target is probed once (`loadgen.resolve.probe_target`: `/v1/models` and the first of its
kind's info endpoints that answers, config/kinds.py `info`); `engine_facts` reads that probe.
A part that did not answer, or answered a field of the wrong shape, leaves its facts unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from config.endpoints import wire_number
from config.kinds import engine_kind, kinds
from loadgen.resolve import TargetProbe


@dataclass(frozen=True)
class EngineFacts:
    """What the engine's endpoints said (None: they did not say)."""

    model: str | None = None
    quantization: str | None = None
    weights_bytes: float | None = None
    parameters: float | None = None
    slots: int | None = None
    trained_context: int | None = None
    slot_context: int | None = None
    model_path: str | None = None

    def known(self) -> dict[str, Any]:
        """The facts that are known, by name (the EngineResult fields of the same names)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def models_facts(models: Any) -> dict[str, Any]:
    """Model id, sizes and contexts of a `/v1/models` document (llama.cpp's `meta`, SGLang's
    `max_model_len`)."""
    data = models.get("data") if isinstance(models, dict) else None
    first: dict[str, Any] = {}
    if isinstance(data, list) and data and isinstance(data[0], dict):
        first = data[0]
    meta = first["meta"] if isinstance(first.get("meta"), dict) else {}
    facts: dict[str, Any] = {}
    if first.get("id") is not None:
        facts["model"] = str(first["id"])
    for key, value in (
        ("weights_bytes", wire_number(meta.get("size"), float)),
        ("parameters", wire_number(meta.get("n_params"), float)),
        ("trained_context", wire_number(meta.get("n_ctx_train"), int)),
        ("slot_context", wire_number(first.get("max_model_len"), int)),
    ):
        if value:
            facts[key] = value
    return facts


def engine_facts(probe: TargetProbe) -> EngineFacts:
    """Model, quantization, sizes, slots and contexts from the target's one probe."""
    facts = models_facts(probe.models)
    if probe.info and probe.kind in kinds():
        facts.update(engine_kind(probe.kind).info.read(probe.info))
    return EngineFacts(**facts)
