"""Follow a llama-server log file for what its HTTP endpoints do not tell.

Current llama.cpp prints the load-time lines (offloaded layers, model/KV buffer
sizes) only at `-lv 4`; the per-request timing lines, slot releases and the KV
pressure warnings print at the default verbosity. Both the plain format
(`M.SS.mmm.uuu I <text>`) and `--log-jsonl` are understood.

The follower is polled from the scrape (no timer of its own): each poll reads
what was appended since the last one, at most `max_bytes`, so a huge log is
caught up over several scrapes instead of stalling one.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

MIB = 1024 * 1024
# Last bytes read, compared on each poll to notice a file rewritten in place.
TAIL_BYTES = 64

_TS = re.compile(r"^(\d{1,9})\.(\d{2})\.(\d{3})\.(\d{3}) [A-Z] ")
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d{1,9})/(\d{1,9}) layers to GPU")
# Bounded digits: a corrupt line cannot make a number the float/int conversion rejects.
_NUM = r"(\d{1,15}(?:\.\d{1,9})?)"
_MODEL_BUF = re.compile(rf"load_tensors:\s+(\S{{1,64}}) model buffer size =\s+{_NUM} MiB")
_KV_BUF = re.compile(rf"llama_kv_cache:\s+(\S{{1,64}}) KV buffer size =\s+{_NUM} MiB")
_INIT = re.compile(
    r"initializing, n_slots = (\d{1,9}), n_ctx_slot = (\d{1,12}), kv_unified = '(\w+)'"
)
_PROMPT_EVAL = re.compile(rf"prompt eval time =\s+{_NUM} ms /\s+(\d{{1,12}}) tokens")
_EVAL = re.compile(rf"\s eval time =\s+{_NUM} ms /\s+(\d{{1,12}}) tokens")
# Devices seen in one process's log; more is a corrupt log, not a machine.
MAX_DEVICES = 16
_RELEASE = re.compile(r"release: .*stop processing: n_tokens = \d+, truncated = (\d)")
_PRESSURE = {
    "kv_no_space": "failed to find free space in the KV cache",
    "context_exceeded": "Context size has been exceeded",
    "context_shift": "slot context shift",
}
# A new server process writing to the same file starts over.
_RESTART = ("llama_server: initializing", "srv  llama_server: initializing")


def _log_seconds(line: str) -> float | None:
    match = _TS.match(line)
    if not match:
        return None
    minutes, secs, millis, micros = (int(g) for g in match.groups())
    return minutes * 60 + secs + millis / 1e3 + micros / 1e6


@dataclass
class LogState:
    """What the log has told us about the current server process."""

    layers_offloaded: int | None = None
    layers_total: int | None = None
    model_buffer_bytes: dict[str, float] = field(default_factory=dict)
    kv_buffer_bytes: dict[str, float] = field(default_factory=dict)
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    kv_unified: bool | None = None
    load_seconds: float | None = None
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    eval_tokens: int = 0
    # Tokens after the first of each request: the first comes out of the prompt pass, so
    # decode time covers N-1 intervals (llama.cpp's timings.predicted_per_second does the same,
    # and SGLang's inter-token-latency count is per interval too).
    eval_intervals: int = 0
    eval_seconds: float = 0.0
    requests_finished: int = 0
    events: Counter[str] = field(default_factory=Counter)
    # Server processes that started writing to this file since the follower began (the
    # collector counts an increase as a restart). Survives the reset at each new process.
    instances: int = 0
    _load_started: float | None = None
    # KV buffers are logged once per cache (SWA and non-SWA); sum them per device.
    _seen_kv_lines: int = 0

    def feed(self, raw: str) -> None:
        """Update the state from one log line; a line it cannot read is skipped."""
        line = raw.rstrip("\n")
        if line.startswith("{"):
            try:
                msg = json.loads(line).get("msg", "")
            except (ValueError, AttributeError, RecursionError):
                return
            if not isinstance(msg, str):
                return
            line = msg
        if any(marker in line for marker in _RESTART):
            instances = self.instances + 1
            self.__init__()  # type: ignore[misc]
            self.instances = instances
        if "load_model: loading model" in line:
            self._load_started = _log_seconds(line)
        elif "llama_server: model loaded" in line and self._load_started is not None:
            done = _log_seconds(line)
            if done is not None:
                self.load_seconds = max(0.0, done - self._load_started)
        if match := _OFFLOADED.search(line):
            self.layers_offloaded, self.layers_total = int(match[1]), int(match[2])
        elif match := _MODEL_BUF.search(line):
            if match[1] in self.model_buffer_bytes or len(self.model_buffer_bytes) < MAX_DEVICES:
                self.model_buffer_bytes[match[1]] = float(match[2]) * MIB
        elif match := _KV_BUF.search(line):
            dev = match[1]
            if dev not in self.kv_buffer_bytes and len(self.kv_buffer_bytes) >= MAX_DEVICES:
                return
            self.kv_buffer_bytes[dev] = self.kv_buffer_bytes.get(dev, 0.0) + float(match[2]) * MIB
        elif match := _INIT.search(line):
            self.n_slots, self.n_ctx_slot = int(match[1]), int(match[2])
            self.kv_unified = match[3] == "true"
        elif match := _PROMPT_EVAL.search(line):
            self.prompt_seconds += float(match[1]) / 1e3
            self.prompt_tokens += int(match[2])
        elif match := _EVAL.search(line):
            self.eval_seconds += float(match[1]) / 1e3
            self.eval_tokens += int(match[2])
            self.eval_intervals += max(0, int(match[2]) - 1)
        elif match := _RELEASE.search(line):
            self.requests_finished += 1
            if match[1] == "1":
                self.events["slot_truncated"] += 1
        else:
            for event, text in _PRESSURE.items():
                if text in line:
                    self.events[event] += 1


class LogFollower:
    """Reads a growing log file incrementally; starts over when it is truncated or replaced."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 8 * MIB):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.state = LogState()
        self._offset = 0
        self._inode: int | None = None
        self._partial = ""
        self._tail = b""

    def poll(self) -> LogState:
        """Read what was appended since the last poll. Raises OSError when unreadable."""
        st = self.path.stat()
        with self.path.open("rb") as fh:
            if self._inode != st.st_ino or st.st_size < self._offset or self._rewritten(fh):
                # A replaced or rewritten file: a new server process (its init line counts
                # it). A restarted llama-server truncates its --log-file and may have written
                # more than we had read before we look again, so sizes alone cannot tell.
                self.state = LogState(instances=self.state.instances)
                self._offset = 0
                self._partial = ""
                self._tail = b""
                self._inode = st.st_ino
            if st.st_size > self._offset:
                fh.seek(self._offset)
                data = fh.read(self.max_bytes)
                self._offset += len(data)
                self._tail = (self._tail + data)[-TAIL_BYTES:]
                text = self._partial + data.decode("utf-8", errors="replace")
                lines = text.split("\n")
                self._partial = lines.pop()
                for line in lines:
                    self.state.feed(line)
        return self.state

    def _rewritten(self, fh: BinaryIO) -> bool:
        """Whether the bytes just before our offset are no longer the ones we read there."""
        if not self._tail:
            return False
        fh.seek(self._offset - len(self._tail))
        return fh.read(len(self._tail)) != self._tail
