"""Prompt calibration: the prompt set of a spec, counted once per run on the first target."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from config.kinds import engine_kind, kinds
from loadgen.client import StreamClient, StreamResult
from loadgen.prompts import CalibrationError, TokenCounter, calibrate, fixed_prompt
from loadgen.scheduler.context import Prompts, RunContext
from loadgen.scheduler.spec import RunSpec
from loadgen.traffic.model import Traffic
from loadgen.traffic.prompts import LEAD, WORDS, TrafficPrompts, sample_text

log = logging.getLogger(__name__)
# Word counts the traffic's overhead is read at: the words are one token each when the two
# agree (checked, and every request's prompt_tokens is checked again against the traffic).
_OVERHEAD_PROBES = (16, 96)
# A word is one token when eight of it after LEAD cost eight; fewer such words than this and
# the prompts would repeat too much to stand for text.
_WORD_REPEATS = 8
_MIN_VOCAB = 16


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
    try:
        data = await client.post_json(path, {"content": text, "add_special": True})
        return len(data["tokens"])
    except aiohttp.ClientResponseError as exc:
        why = f"answers HTTP {exc.status}"
    except (ValueError, KeyError, TypeError):
        why = "does not answer a token list"
    # Its kind says it tokenizes here (--kind, or what it answered): it is not that engine.
    raise CalibrationError(
        f"{client.target.url}{path} {why}: is it a {client.target.kind} server (--kind)?"
    )


def token_counter(spec: RunSpec, client: StreamClient) -> TokenCounter:
    """How this target counts a prompt's tokens as a request of `spec` would have them."""
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

    return count


async def traffic_prompts(traffic: Traffic, count: TokenCounter) -> TrafficPrompts:
    """The traffic's prompts for this tokenizer: the tokens a prompt has besides its words,
    and the words that are one token each (all of WORDS on ordinary tokenizers: two probes)."""
    short, long = _OVERHEAD_PROBES
    overhead = await count(sample_text(short)) - short
    if await count(sample_text(long)) - long == overhead:
        return _traffic_prompts(traffic, overhead, WORDS)
    # Not one token a word: keep the words that are, one probe each (LEAD, then the word
    # eight times), and count the template again with them.
    base = await count(LEAD)
    kept = []
    for word in WORDS:
        if await count(" ".join([LEAD, *[word] * _WORD_REPEATS])) - base == _WORD_REPEATS:
            kept.append(word)
    vocab = tuple(kept)
    if len(vocab) < _MIN_VOCAB:
        raise CalibrationError(
            f"--traffic: only {len(vocab)} of {len(WORDS)} common words are one token each on "
            "this tokenizer: the prompts cannot be made token-exact"
        )
    overhead = await count(sample_text(short, vocab=vocab)) - short
    again = await count(sample_text(long, vocab=vocab)) - long
    if again != overhead:
        log.warning(
            "the traffic's words are not one token each on this tokenizer (%d and %d tokens "
            "besides %d and %d words): prompt lengths will be off, see prompt_tokens_off",
            overhead,
            again,
            short,
            long,
        )
    return _traffic_prompts(traffic, overhead, vocab)


def _traffic_prompts(traffic: Traffic, overhead: int, vocab: tuple[str, ...]) -> TrafficPrompts:
    if overhead < 0:
        raise CalibrationError(f"--traffic: a prompt counts {overhead} tokens besides its words")
    log.info(
        "traffic prompts: %d tokens of template and BOS around the words, %d words one token",
        overhead,
        len(vocab),
    )
    return TrafficPrompts(traffic, overhead, vocab)


async def prompts_for(ctx: RunContext, spec: RunSpec, client: StreamClient) -> Prompts:
    """The prompt set of this spec, calibrated once per run on the first target."""
    if spec.prompt_text is not None:
        return fixed_prompt(spec.prompt_text, spec.cache)
    if spec.traffic is not None:
        key: tuple[int | None, str, str] = (None, "traffic", spec.endpoint)
        cached = ctx.prompts.get(key)
        if not isinstance(cached, TrafficPrompts):
            made = await traffic_prompts(spec.traffic, token_counter(spec, client))
            ctx.prompts[key] = cached = made
        # The calibration is the tokenizer's, not the traffic's: another traffic (a step's
        # next round) takes it as it is, no probe inside the step's window.
        return cached if cached.traffic is spec.traffic else cached.with_traffic(spec.traffic)
    key = (spec.prompt_tokens, spec.cache, spec.endpoint)
    if key not in ctx.prompts:
        if spec.prompt_tokens is None:
            raise ValueError("either prompt_tokens or prompt_text is required")
        count = token_counter(spec, client)
        ctx.prompts[key] = await calibrate(spec.prompt_tokens, count, spec.cache)
    return ctx.prompts[key]


def calibration_deadline(spec: RunSpec) -> float:
    """Seconds the prompt calibration may take: a few probes' worth of `timeout`."""
    return 3 * spec.timeout + spec.connect_timeout


async def calibrate_within(ctx: RunContext, spec: RunSpec, client: StreamClient) -> Prompts:
    limit = calibration_deadline(spec)
    try:
        return await asyncio.wait_for(prompts_for(ctx, spec, client), timeout=limit)
    except asyncio.TimeoutError:
        raise CalibrationError(
            f"{client.target.name}: prompt calibration not finished within {limit:g} s "
            "(the engine does not answer; see --timeout)"
        ) from None


async def calibrate_first(ctx: RunContext, spec: RunSpec) -> Prompts:
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
