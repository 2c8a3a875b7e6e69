"""What each engine's own info endpoint says, as `diagnose.probe.EngineFacts` field names.

Pure readers of the JSON bodies the rows of config/kinds.py name (`InfoEndpoint.read`); a
field the body lacks, or gives in a shape that is not its own, is left out, so the fact stays
unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

N = TypeVar("N", int, float)


def wire_number(value: Any, kind: Callable[[Any], N]) -> N | None:
    """A number an engine sent, as `kind` (int or float); None when absent or not a number."""
    if value is None or isinstance(value, bool | dict | list):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError):  # "abc", inf as int: not a number here
        return None


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def llamacpp_props_facts(props: dict[str, Any]) -> dict[str, Any]:
    """Precision, slots, slot context and model path from llama-server's /props."""
    facts: dict[str, Any] = {}
    if props.get("model_ftype"):
        facts["quantization"] = str(props["model_ftype"])
    if slots := wire_number(props.get("total_slots"), int):
        facts["slots"] = slots
    gen = _object(props.get("default_generation_settings"))
    if n_ctx := wire_number(gen.get("n_ctx"), int):
        facts["slot_context"] = n_ctx
    if props.get("model_path"):
        facts["model_path"] = str(props["model_path"])
    return facts


def sglang_server_info_facts(info: dict[str, Any]) -> dict[str, Any]:
    """Precision, slots, context, weight bytes and model path from SGLang's /server_info."""
    facts: dict[str, Any] = {}
    # "auto" means the checkpoint's own dtype, which /server_info does not name: unknown.
    quant = next(
        (str(info[k]) for k in ("quantization", "dtype") if info.get(k) and info[k] != "auto"),
        None,
    )
    kv = info.get("kv_cache_dtype")
    if quant:
        facts["quantization"] = quant + (f" kv {kv}" if kv and kv != "auto" else "")
    if slots := wire_number(info.get("max_running_requests"), int):
        facts["slots"] = slots
    if context := wire_number(info.get("context_length"), int):
        facts["slot_context"] = context
    if isinstance(info.get("model_path"), str) and info["model_path"]:
        facts["model_path"] = info["model_path"]
    states = info.get("internal_states")
    state = _object(states[0]) if isinstance(states, list) and states else {}
    weight = wire_number(_object(state.get("memory_usage")).get("weight"), float)
    if weight:
        facts["weights_bytes"] = weight * 2**30
    if eff := wire_number(state.get("effective_max_running_requests_per_dp"), int):
        facts["slots"] = eff
    return facts
