"""Engine probing: what the engine's own endpoints say (model, precision, slots, contexts).

`detect_kind` tells llama.cpp (`/props`) from SGLang (`/server_info`); `engine_facts` reads
`/v1/models` plus the kind's own endpoint. A probe that fails leaves its facts unknown.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any

import httpx

from loadgen.client import StreamClient


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


async def engine_facts(client: StreamClient, kind: str) -> EngineFacts:
    """Model, quantization, sizes, slots and contexts from the engine's own endpoints."""
    facts: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        models = await client.get_json("/v1/models")
        first = (models.get("data") or [{}])[0]
        facts["model"] = first.get("id")
        meta = first.get("meta") or {}
        for src, dst in (("size", "weights_bytes"), ("n_params", "parameters")):
            if meta.get(src):
                facts[dst] = float(meta[src])
        if meta.get("n_ctx_train"):
            facts["trained_context"] = int(meta["n_ctx_train"])
        if first.get("max_model_len"):
            facts["slot_context"] = int(first["max_model_len"])
    if kind == "llamacpp":
        with contextlib.suppress(Exception):
            props = await client.get_json("/props")
            if props.get("model_ftype"):
                facts["quantization"] = str(props["model_ftype"])
            if props.get("total_slots"):
                facts["slots"] = int(props["total_slots"])
            gen = props.get("default_generation_settings") or {}
            if gen.get("n_ctx"):
                facts["slot_context"] = int(gen["n_ctx"])
            if props.get("model_path"):
                facts["model_path"] = str(props["model_path"])
    elif kind == "sglang":
        info: dict[str, Any] = {}
        for path in ("/server_info", "/get_server_info"):
            with contextlib.suppress(Exception):
                info = await client.get_json(path)
                break
        facts.update(sglang_facts(info))
    return EngineFacts(**facts)


def sglang_facts(info: dict[str, Any]) -> dict[str, Any]:
    """Precision, slots, context and weight bytes from SGLang's /server_info."""
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
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        mem = states[0].get("memory_usage") or {}
        if mem.get("weight"):
            facts["weights_bytes"] = float(mem["weight"]) * 2**30
        eff = states[0].get("effective_max_running_requests_per_dp")
        if eff:
            facts["slots"] = int(eff)
    return facts


async def detect_kind(url: str, api_key: str | None) -> str:
    """llamacpp when /props answers, sglang when /server_info does, else openai."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=5.0, headers=headers) as client:
        for path, kind in (
            ("/props", "llamacpp"),
            ("/server_info", "sglang"),
            ("/get_server_info", "sglang"),
        ):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await client.get(url + path)
                if resp.status_code == 200 and isinstance(resp.json(), dict):
                    return kind
    return "openai"
