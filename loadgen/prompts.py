"""Fixed prompts of a chosen token length, with prompt-cache control.

A prompt is `Request <id words>. <filler words>`. The id words spell the request index in
base 16 with one common English word per digit, so every `--cache unique` prompt starts
differently (no engine can reuse a cached prefix) while keeping the same token count in
ordinary tokenizers: each id word is one token with its leading space. `--cache same` uses
the id of request 0 for every request. The filler length is calibrated against the server's
own tokenizer (llama.cpp `/tokenize`, or the `usage.prompt_tokens` of a probe request).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Sixteen short, frequent words: one per hex digit of the request index.
ID_WORDS = (
    "apple river stone cloud green table music light "
    "house water paper horse bread glass chair dream"
).split()
ID_DIGITS = 5  # 16**5 = 1,048,576 distinct prefixes
ID_SPACE = 16**ID_DIGITS
# Ids from here on are reserved for calibration probes (measured requests count up from 0,
# warm-up requests down from the top), so a probe never warms the cache for a measured one.
CALIBRATION_BASE = ID_SPACE // 2

FILLER_WORDS = (
    "the quick brown fox jumps over a lazy dog while people in the city walk to work "
    "and talk about the weather the news and the game that was played last night on "
    "the old field near the river where children run and birds sing in tall trees"
).split()

CACHE_MODES = ("unique", "same")

TokenCounter = Callable[[str], Awaitable[int]]


class CalibrationError(Exception):
    """The prompt cannot be built with the requested token count."""


def id_words(index: int) -> str:
    """Spell `index` (mod 16**5) as five id words."""
    index %= ID_SPACE
    digits = []
    for _ in range(ID_DIGITS):
        digits.append(ID_WORDS[index % 16])
        index //= 16
    return " ".join(reversed(digits))


def filler(words: int) -> str:
    """Deterministic filler text of `words` words."""
    n = len(FILLER_WORDS)
    return " ".join(FILLER_WORDS[i % n] for i in range(words))


@dataclass(frozen=True)
class PromptSet:
    """The prompts of one step: `text(i)` is the prompt of request i."""

    body: str
    cache: str = "unique"
    target_tokens: int | None = None
    measured_tokens: int | None = None

    def text(self, index: int) -> str:
        """Prompt of request `index` (the same for every index with `cache='same'`)."""
        ident = id_words(index if self.cache == "unique" else 0)
        return f"Request {ident}. {self.body}"

    def calibration_text(self, index: int) -> str:
        """Prompt used to count tokens; its id never collides with a measured request."""
        return self.text(CALIBRATION_BASE + index) if self.cache == "unique" else self.text(0)

    def warmup_text(self, index: int) -> str:
        """Prompt of warm-up request `index`, outside the range measured requests use."""
        if self.cache == "same":
            return self.text(0)
        return self.text(ID_SPACE - 1 - index)


def fixed_prompt(text: str, cache: str = "unique") -> PromptSet:
    """A prompt set around a given text (from `--prompt-file`)."""
    return PromptSet(body=text, cache=cache)


async def calibrate(
    target_tokens: int, count: TokenCounter, cache: str = "unique", max_steps: int = 12
) -> PromptSet:
    """Find the filler length whose prompt has `target_tokens` tokens on the server.

    Secant steps on the (nearly linear) words -> tokens curve, then a local search of
    a few words; the closest count wins when no word count hits the target exactly.
    """
    if target_tokens < 1:
        raise CalibrationError("--prompt-tokens must be at least 1")
    seen: dict[int, int] = {}

    async def tokens(words: int) -> int:
        if words not in seen:
            seen[words] = await count(PromptSet(filler(words), cache).calibration_text(0))
        return seen[words]

    base = await tokens(0)
    if target_tokens < base:
        raise CalibrationError(
            f"--prompt-tokens {target_tokens} is below the fixed part of the prompt "
            f"({base} tokens with the chat template and request id)"
        )
    lo_w, lo_t = 0, base
    words = max(target_tokens - base, 0)
    for _ in range(max_steps):
        got = await tokens(words)
        if got == target_tokens:
            break
        # Secant through the base point and this one; guard against a flat curve.
        slope = (got - lo_t) / (words - lo_w) if words != lo_w else 1.0
        slope = slope if slope > 0 else 1.0
        nxt = max(0, round(words + (target_tokens - got) / slope))
        if nxt == words or nxt in seen:
            break
        lo_w, lo_t = words, got
        words = nxt
    best = min(seen, key=lambda w: (abs(seen[w] - target_tokens), seen[w] > target_tokens))
    if seen[best] != target_tokens:
        for delta in (1, -1, 2, -2, 3, -3):
            cand = best + delta
            if cand >= 0 and await tokens(cand) == target_tokens:
                best = cand
                break
        best = min(seen, key=lambda w: (abs(seen[w] - target_tokens), seen[w] > target_tokens))
    prompts = PromptSet(filler(best), cache, target_tokens, seen[best])
    if seen[best] != target_tokens:
        log.warning("prompt calibrated to %d tokens (closest to %d)", seen[best], target_tokens)
    # The unique prefixes must all cost the same number of tokens; spot-check far-apart ids.
    for index in (1, 0x2A5C3, 0x3FFFF):
        other = await count(prompts.calibration_text(index))
        if other != seen[best]:
            log.warning(
                "request id %d gives %d prompt tokens instead of %d with this tokenizer",
                index,
                other,
                seen[best],
            )
    log.info("prompt calibrated: %d filler words -> %d tokens", best, seen[best])
    return prompts
