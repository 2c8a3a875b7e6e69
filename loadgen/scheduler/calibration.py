"""Prompt calibration: the prompt set of a spec, counted once per run on the first target."""

from __future__ import annotations

import asyncio

from config.kinds import engine_kind, kinds
from loadgen.client import StreamClient, StreamResult
from loadgen.prompts import CalibrationError, PromptSet, calibrate, fixed_prompt
from loadgen.scheduler.context import RunContext
from loadgen.scheduler.spec import RunSpec


async def _count_by_probe(client: StreamClient, spec: RunSpec, text: str, attempts: int = 3) -> int:
    params = spec.request_params() | {"max_tokens": 1}
    result = StreamResult()
    # A probe is one request like any other: retry a transient failure before giving up.
    for _ in range(attempts):
        result = await client.stream(client.build_body(text, params), spec.timeout)
        if result.usage is not None and "prompt_tokens" in result.usage:
            return int(result.usage["prompt_tokens"])
    raise RuntimeError(
        f"cannot count prompt tokens on {client.target.name}: "
        f"{result.error or 'no usage'} {result.error_detail or ''}".strip()
    )


async def _count_by_tokenize(client: StreamClient, path: str, text: str) -> int:
    data = await client.post_json(path, {"content": text, "add_special": True})
    return len(data["tokens"])


async def prompts_for(ctx: RunContext, spec: RunSpec, client: StreamClient) -> PromptSet:
    """The prompt set of this spec, calibrated once per run on the first target."""
    if spec.prompt_text is not None:
        return fixed_prompt(spec.prompt_text, spec.cache)
    key = (spec.prompt_tokens, spec.cache, spec.endpoint)
    if key not in ctx.prompts:
        if spec.prompt_tokens is None:
            raise ValueError("either prompt_tokens or prompt_text is required")

        # A kind's tokenize endpoint (llama.cpp's /tokenize, with BOS) equals the prompt_tokens
        # of /v1/completions and costs no prefill; the chat template adds tokens only a real
        # request can count.
        known = client.target.kind in kinds()
        kind = engine_kind(client.target.kind) if known else None
        tokenize = kind.tokenize_path if kind and spec.endpoint == "completions" else None

        async def count(text: str) -> int:
            if tokenize:
                return await _count_by_tokenize(client, tokenize, text)
            return await _count_by_probe(client, spec, text)

        ctx.prompts[key] = await calibrate(spec.prompt_tokens, count, spec.cache)
    return ctx.prompts[key]


def calibration_deadline(spec: RunSpec) -> float:
    """Seconds the prompt calibration may take: a few probes' worth of `timeout`."""
    return 3 * spec.timeout + spec.connect_timeout


async def calibrate_within(ctx: RunContext, spec: RunSpec, client: StreamClient) -> PromptSet:
    limit = calibration_deadline(spec)
    try:
        return await asyncio.wait_for(prompts_for(ctx, spec, client), timeout=limit)
    except asyncio.TimeoutError:
        raise CalibrationError(
            f"{client.target.name}: prompt calibration not finished within {limit:g} s "
            "(the engine does not answer; see --timeout)"
        ) from None


async def calibrate_first(ctx: RunContext, spec: RunSpec) -> PromptSet:
    """The spec's prompts, calibrated now on its first target (once per run, as in a step).

    A caller that reads the engine's own timings over a step window calls it before the
    window opens: the calibration probes are requests the engine times too.
    """
    target = spec.targets[0]
    async with StreamClient(
        target, pool_size=1, endpoint=spec.endpoint, connect_timeout=spec.connect_timeout
    ) as client:
        await client.open(1)
        return await calibrate_within(ctx, spec, client)
