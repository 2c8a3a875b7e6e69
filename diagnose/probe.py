"""Engine probing: what the engine's own endpoints say (model, precision, slots, contexts).

`detect_kind` finds the registered kind whose info endpoint answers (config/kinds.py: llama.cpp
`/props`, SGLang `/server_info`); `engine_facts` reads `/v1/models` plus that endpoint. A
probe that fails leaves its facts unknown. Every probe goes through the load generator's own
client (`loadgen.client.StreamClient`, aiohttp), as every later request.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any

from config.kinds import ENGINES, engine_kind
from loadgen.client import StreamClient, probe_client, server_model_async


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


async def detect_kind(client: StreamClient) -> str:
    """The first registered kind whose info endpoint answers a JSON object, else openai."""
    for engine in ENGINES:
        for path in engine.info.paths:
            if isinstance(await client.probe_json(path), dict):
                return engine.kind
    return "openai"


async def probe_url(
    url: str, api_key: str | None, kind: str, model: bool
) -> tuple[str, str | None]:
    """A bare `--url`: its kind (detected when `kind` is openai) and, when `model`, its model
    id, over one client (the load generator's, as every later request)."""
    async with probe_client(url, api_key) as client:
        if kind == "openai":
            kind = await detect_kind(client)
        return kind, (await server_model_async(client) if model else None)
