"""How to get what a report left unknown: every "unknown" and every plot left out names
its fix (a flag, a config key or the reason a step did not run).
"""

from __future__ import annotations

from diagnose.decision.model import EngineResult

GIB = 2**30

# How to get a value that came out unknown: every "unknown" in the report names its fix.
FIX_EXPORTER = "pass --exporter-url (an llmb-exporter on the GPU host)"

FIX_BANDWIDTH = "pass --bandwidth-gbs (or set gpu.bandwidth_bytes_per_second in the config)"

FIX_LAUNCH = "add a launch template (engines[].launch) to the config so the tool starts the engine"

FIX_CONTEXT_SWEEP = (
    "needs a launch template with {ctx} (engines[].launch) in the config; --contexts or "
    "--max-context set its range"
)


def unknown(why: str) -> str:
    return "unknown: " + why


def missing_why(engines: list[EngineResult], step: str) -> str | None:
    """The reason diagnose recorded for `step` not running ("step: why" in missing)."""
    for e in engines:
        for m in e.missing:
            if m.startswith(step + ": "):
                return m.split(": ", 1)[1]
    return None


def memory_why(engines: list[EngineResult]) -> str:
    if any(e.memory_source for e in engines):
        return "no memory sample was taken during the run"
    return (
        "no memory source: " + FIX_EXPORTER + ", or run on the GPU host so NVML is found, or "
        "let the tool launch the engine (host memory)"
    )


def roofline_unknown(e: EngineResult) -> str:
    """Why the card's decode limit is unknown for `e`, with the flag that fixes it."""
    if not (e.roofline.bandwidth_bytes_per_s or e.bandwidth_bytes_per_s):
        return "GPU memory bandwidth unknown: " + FIX_BANDWIDTH
    if not e.weights_bytes:
        return "model weight size unknown: " + FIX_EXPORTER
    return "single-request decode not measured"
