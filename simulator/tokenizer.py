"""Deterministic toy tokenizers, so token counts are reproducible without a model.

Two schemes exist on purpose: two simulators started with different tokenizers give
different token counts for the same text, which is what the load generator must detect
when it compares engines.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

# Special tags (<bos>, <start_of_turn>) are one token each, as in real vocabularies.
_WORD_RE = re.compile(r"<[A-Za-z_|/]+>|\s*[A-Za-z0-9]+|\s*[^\sA-Za-z0-9]|\s+")

# What the simulated model "says": a fixed vocabulary so the output is readable.
GENERATION_WORDS: tuple[str, ...] = (
    " the",
    " GPU",
    " memory",
    " bandwidth",
    " is",
    " a",
    " model",
    " of",
    " tokens",
    " and",
    " cache",
    " decode",
    " prefill",
    " batch",
    " slot",
    " queue",
    " layer",
    " weights",
    " fast",
    " slow",
    " in",
    " to",
    " with",
    " on",
    ".",
    ",",
    " we",
    " it",
    " serves",
    " request",
)

NAMES = ("word", "char4")


class Tokenizer:
    """Maps text to token ids and back with a fixed, seedless rule."""

    def __init__(self, name: str = "word", n_vocab: int = 262144):
        if name not in NAMES:
            raise ValueError(f"unknown tokenizer {name!r} (known: {', '.join(NAMES)})")
        self.name = name
        self.n_vocab = n_vocab
        self._pieces: dict[int, str] = {}

    def split(self, text: str) -> list[str]:
        """Cut text into token pieces."""
        if self.name == "char4":
            return [text[i : i + 4] for i in range(0, len(text), 4)]
        return _WORD_RE.findall(text)

    def piece_id(self, piece: str) -> int:
        """Stable id of one piece (remembered so it can be decoded)."""
        # Ids 0..9 are reserved for specials so ordinary pieces never collide with them.
        token = 10 + zlib.crc32(f"{self.name}:{piece}".encode()) % (self.n_vocab - 10)
        self._pieces.setdefault(token, piece)
        return token

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return [self.piece_id(p) for p in self.split(text)]

    def decode(self, tokens: Iterable[int]) -> str:
        """Text of token ids produced by this tokenizer (unknown ids decode to nothing)."""
        return "".join(self._pieces.get(t, "") for t in tokens)
