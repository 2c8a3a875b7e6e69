"""Engine probing: what the engine's own endpoints say (model, precision, slots, contexts).

`detect_kind` finds the registered kind whose info endpoint answers (config/kinds.py: llama.cpp
`/props`, SGLang `/server_info`); `engine_facts` reads `/v1/models` plus that endpoint. A
probe that fails leaves its facts unknown.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any

import httpx

from config.kinds import ENGINES, engine_kind
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
    with contextlib.suppress(Exception):
        facts.update(engine_kind(kind).info.read(await _first_info(client, kind)))
    return EngineFacts(**facts)


async def _first_info(client: StreamClient, kind: str) -> dict[str, Any]:
    """The body of the first of the kind's info endpoints that answers ({} when none does)."""
    for path in engine_kind(kind).info.paths:
        with contextlib.suppress(Exception):
            body = await client.get_json(path)
            if isinstance(body, dict):
                return body
    return {}


async def detect_kind(
    url: str, api_key: str | None, transport: httpx.AsyncBaseTransport | None = None
) -> str:
    """The first registered kind whose info endpoint answers a JSON object, else openai."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=5.0, headers=headers, transport=transport) as client:
        for engine in ENGINES:
            for path in engine.info.paths:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    resp = await client.get(url + path)
                    if resp.status_code == 200 and isinstance(resp.json(), dict):
                        return engine.kind
    return "openai"
