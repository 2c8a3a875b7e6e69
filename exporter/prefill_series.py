"""The llmb_model_prefill_* series of a model's geometry (model/flops.py), for every collector
that knows the geometry: FLOPs per prompt token, by part."""

from __future__ import annotations

from core import series as llmb
from exporter.schema import MetricSet
from model.flops import prefill_flops
from model.geometry import ModelGeometry


def add_prefill_structure(ms: MetricSet, geom: ModelGeometry, **labels: str) -> None:
    """The llmb_model_prefill_* series (model/flops.py): FLOPs per prompt token, by part."""
    fl = prefill_flops(geom)
    if fl is None:
        return
    ms.add(llmb.MODEL_PREFILL_FLOPS_PER_TOKEN, fl.matmul_flops, **labels)
    name = llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION
    ms.add(name, fl.attention_flops_full, layers="full", **labels)
    if fl.sliding_window is not None:
        ms.add(name, fl.attention_flops_swa, layers="sliding", **labels)
        ms.add(llmb.MODEL_SLIDING_WINDOW_TOKENS, fl.sliding_window, **labels)
