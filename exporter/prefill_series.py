"""The llmb_model_prefill_* series of a model's geometry (model/flops.py), for every collector
that knows the geometry: FLOPs per prompt token, by part."""

from __future__ import annotations

from exporter.schema import MetricSet
from model.flops import prefill_flops
from model.geometry import ModelGeometry


def add_prefill_structure(ms: MetricSet, geom: ModelGeometry, **labels: str) -> None:
    """The llmb_model_prefill_* series (model/flops.py): FLOPs per prompt token, by part."""
    fl = prefill_flops(geom)
    if fl is None:
        return
    ms.add("llmb_model_prefill_flops_per_token", fl.matmul_flops, **labels)
    name = "llmb_model_prefill_attention_flops_per_position"
    ms.add(name, fl.attention_flops_full, layers="full", **labels)
    if fl.sliding_window is not None:
        ms.add(name, fl.attention_flops_swa, layers="sliding", **labels)
        ms.add("llmb_model_sliding_window_tokens", fl.sliding_window, **labels)
