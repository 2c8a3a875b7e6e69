"""Residency: do the weights fit and stay resident on the GPU?

The answer is the decision core's `weights_not_resident` condition on the rules' signals,
with each measured ratio named with its source; when a ratio cannot be measured, why.
"""

from __future__ import annotations

from config.kinds import engine_kind
from core.conditions import evaluate
from core.signals import Signals
from diagnose.decision.model import Facts
from diagnose.steps.base import Say, StepOutcome, asked, gib, not_measured, num


def residency_outcome(known: Facts, sig: Signals, say: Say) -> StepOutcome:
    """The residency answer from the engine's facts read at rest (its kind, layers, buffers,
    process memory, weights) and the rules' signals then; `weights_not_resident` held:
    flagged."""
    cond = evaluate(sig).condition("weights_not_resident")
    kind = known.kind
    facts = residency_facts(known)
    numbers: dict[str, object] = {name: getattr(sig, name) for name, _ in RESIDENCY_SOURCES}
    numbers["host_has_gpu"] = sig.host_has_gpu
    if not sig.host_has_gpu:
        why = (
            "no GPU seen (no exporter with a GPU, no NVML): the weights are in host memory"
            f" ({facts})"
        )
        return not_measured("residency", why, say, numbers)
    measured = residency_sources(sig, kind)
    if cond.held:
        answer = f"no: {', '.join(cond.evidence)} below the threshold; {measured} ({facts})"
    elif not measured:
        return not_measured("residency", residency_gap(known, kind), say, numbers)
    else:
        answer = f"yes, from {measured} ({facts})"
    say(answer)
    return StepOutcome(asked("residency", answer, cond.held, numbers))


def residency_facts(res: Facts) -> str:
    """The residency figures as the answer lists them."""
    facts = (
        f"layers {num(res.layers_offloaded)}/{num(res.layers_total)}, weights "
        f"{gib(res.weights_bytes)}, GPU weight buffers {gib(res.gpu_buffer_bytes)}, "
        f"process GPU memory {gib(res.process_gpu_bytes)}"
    )
    if res.experts_host_layers:
        facts += (
            f", routed experts of {res.experts_host_layers:.0f} layers in host memory "
            f"({gib(res.experts_host_bytes)}: expert offload)"
        )
    return facts


# Residency signals in the order diagnose names them, with where each comes from.
RESIDENCY_SOURCES: tuple[tuple[str, str], ...] = (
    ("layers_ratio", "layers on the GPU (llama.cpp log)"),
    ("weights_buffers_ratio", ""),  # the kind's own words (config/kinds.py `residency`)
    (
        "weights_memory_beyond_kv_ratio",
        "process GPU memory (NVML) minus the KV pool SGLang reports, against the weights",
    ),
    ("weights_memory_ratio", "process GPU memory (NVML) against the weights"),
    ("experts_host_layers", "layers whose routed experts stay in host memory (llama.cpp log)"),
)


def residency_sources(sig: Signals, kind: str) -> str:
    """The residency figures that were measured, each with its ratio and source."""
    parts = []
    for name, source in RESIDENCY_SOURCES:
        value = getattr(sig, name)
        if value is not None:
            source = source or engine_kind(kind).residency.buffers
            parts.append(f"{name.removesuffix('_ratio')} {value:.2f}: {source}")
    return "; ".join(parts)


def residency_gap(res: Facts, kind: str) -> str:
    """Why residency could not be decided: which of its inputs is missing."""
    missing = []
    if res.weights_bytes is None:
        where = engine_kind(kind).residency.weights
        missing.append(f"the weight size is not known (no {where})")
    if res.process_gpu_bytes is None:
        missing.append("no process GPU memory (NVML) attributed to the engine")
    if res.gpu_buffer_bytes is None and res.layers_total is None:
        missing.append("no layer or weight-buffer figures from the engine")
    if not missing:
        missing.append("the exporter has not computed the ratios yet")
    known = [
        f"{name} {gib(value)}"
        for name, value in (
            ("weights", res.weights_bytes),
            ("GPU weight buffers", res.gpu_buffer_bytes),
            ("process GPU memory", res.process_gpu_bytes),
        )
        if value is not None
    ]
    have = f" (known: {', '.join(known)})" if known else ""
    return "; ".join(missing) + have
