"""The SGLang server log's memory lines, for releases whose /metrics has no memory series.

SGLang 0.5.x, `GB` = GiB as everywhere in SGLang:
  Load weight end. elapsed=0.14 s, type=Qwen2ForCausalLM, avail mem=138.35 GB, mem usage=0.78 GB.
  KV Cache is allocated. #tokens: 3574979, K size: 20.46 GB, V size: 20.46 GB
(MLA models: `KV size: X GB`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30

_LOG_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=(\d+(?:\.\d+)?) GB")
_LOG_KV = re.compile(
    r"KV Cache is allocated\. #tokens: (\d+), (?:K size: (\d+(?:\.\d+)?) GB, "
    r"V size: (\d+(?:\.\d+)?) GB|KV size: (\d+(?:\.\d+)?) GB)"
)
LOG_READ_LIMIT = 8 << 20  # bytes read per scrape; the memory lines come in the first few KiB


@dataclass
class SGLangLogState:
    """What the server log said about the last instance's memory (None = not seen)."""

    weights_bytes: float | None = None
    kv_bytes: float | None = None
    kv_tokens: int | None = None


class SGLangLog:
    """Follows an SGLang server log (`--log-file`, or its captured stdout) from the start."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.state = SGLangLogState()
        self._partial = b""

    def poll(self) -> SGLangLogState:
        """Read what was appended since the last poll; a shorter file starts over."""
        size = self.path.stat().st_size
        if size < self.offset:
            self.offset, self._partial, self.state = 0, b"", SGLangLogState()
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read(LOG_READ_LIMIT)
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()[-65536:]
        for raw in lines:
            self.feed(raw.decode("utf-8", errors="replace"))
        return self.state

    def feed(self, line: str) -> None:
        """One log line; a later instance's lines replace an earlier one's."""
        if (m := _LOG_WEIGHTS.search(line)) is not None:
            weights = float(m.group(1)) * GIB
            self.state = SGLangLogState(weights_bytes=weights if math.isfinite(weights) else None)
        elif (m := _LOG_KV.search(line)) is not None:
            gib = float(m.group(4)) if m.group(4) else float(m.group(2)) + float(m.group(3))
            self.state.kv_bytes = gib * GIB if math.isfinite(gib * GIB) else None
            self.state.kv_tokens = int(m.group(1)) if len(m.group(1)) < 16 else None
