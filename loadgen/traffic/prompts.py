"""Token-exact prompts of a traffic: the text of each request from its blocks.

Every block is a seeded run of short common words, each one token with its leading space in
ordinary tokenizers, so a prompt's tokens are its words plus what the chat template and BOS
add (`overhead`, counted on the engine once per run). The same block id always gives the same
words (a shorter use of a block is a prefix of a longer one), so a shared prefix is the same
tokens on the wire and an engine can reuse its cache.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass

from loadgen.prompts import FILLER_WORDS, ID_WORDS
from loadgen.traffic.model import Traffic

WORDS = tuple(dict.fromkeys([*ID_WORDS, *FILLER_WORDS]))
# Every prompt's first word: the template's tokens before the text then end the same way for
# every request (a word without its leading space may cost another token).
LEAD = "the"
# Warm-up prompts use block ids from here, never a measured request's.
_WARMUP_BASE = 1 << 44


@functools.lru_cache(maxsize=8192)
def block_words(block: int, tokens: int, vocab: tuple[str, ...] = WORDS) -> tuple[str, ...]:
    """The first `tokens` words of block `block` (seeded by the id alone) from `vocab`."""
    rng = random.Random(block)
    count = len(vocab)
    return tuple(vocab[rng.randrange(count)] for _ in range(tokens))


def sample_text(words: int, block: int = _WARMUP_BASE - 1, vocab: tuple[str, ...] = WORDS) -> str:
    """A prompt of `words` words (LEAD, then one block's): what calibration counts."""
    return " ".join((LEAD, *block_words(block, max(0, words - 1), vocab)))


@dataclass(frozen=True)
class TrafficPrompts:
    """The prompts of a traffic for one engine's tokenizer (`overhead` calibrated)."""

    traffic: Traffic
    overhead: int
    # The words that are one token each on this tokenizer (calibrated).
    vocab: tuple[str, ...] = WORDS
    # Never the fixed prompt's figures: lengths differ per request.
    target_tokens: int | None = None
    measured_tokens: int | None = None
    cache: str = "traffic"

    def with_traffic(self, traffic: Traffic) -> TrafficPrompts:
        """The prompts of another traffic on the same calibration (overhead and words)."""
        return dataclasses.replace(self, traffic=traffic)

    def words(self, index: int) -> int:
        """Body words of request `index`: its prompt tokens less the overhead (at least 1)."""
        return max(1, self.traffic.requests[index].prompt_tokens - self.overhead)

    def text(self, index: int) -> str:
        """The prompt of request `index`: its blocks' words, less the overhead's worth at
        the start (the template's tokens take those positions)."""
        req = self.traffic.requests[index]
        words: list[str] = []
        for block, tokens in req.blocks:
            words.extend(block_words(block, tokens, self.vocab))
        skip = min(self.overhead, len(words) - 1)
        return " ".join((LEAD, *words[skip + 1 :]))

    def warmup_text(self, index: int) -> str:
        """A warm-up prompt as long as request `index`, sharing no block with any request."""
        words = self.words(index % len(self.traffic.requests))
        return sample_text(words, _WARMUP_BASE + index, self.vocab)

    def output_tokens(self, index: int) -> int:
        """Tokens request `index` asks for."""
        return self.traffic.requests[index % len(self.traffic.requests)].output_tokens
