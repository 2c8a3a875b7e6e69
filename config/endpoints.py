"""What each engine's own info endpoint says, as `diagnose.probe.EngineFacts` field names.

Pure readers of the JSON bodies the rows of config/kinds.py name (`InfoEndpoint.read`); a
field the body lacks is left out, so the fact stays unknown.
"""

from __future__ import annotations

from typing import Any


def llamacpp_props_facts(props: dict[str, Any]) -> dict[str, Any]:
    """Precision, slots, slot context and model path from llama-server's /props."""
    facts: dict[str, Any] = {}
    if props.get("model_ftype"):
        facts["quantization"] = str(props["model_ftype"])
    if props.get("total_slots"):
        facts["slots"] = int(props["total_slots"])
    gen = props.get("default_generation_settings") or {}
    if gen.get("n_ctx"):
        facts["slot_context"] = int(gen["n_ctx"])
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
    if info.get("max_running_requests"):
        facts["slots"] = int(info["max_running_requests"])
    if info.get("context_length"):
        facts["slot_context"] = int(info["context_length"])
    if isinstance(info.get("model_path"), str) and info["model_path"]:
        facts["model_path"] = info["model_path"]
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        mem = states[0].get("memory_usage") or {}
        if mem.get("weight"):
            facts["weights_bytes"] = float(mem["weight"]) * 2**30
        eff = states[0].get("effective_max_running_requests_per_dp")
        if eff:
            facts["slots"] = int(eff)
    return facts
