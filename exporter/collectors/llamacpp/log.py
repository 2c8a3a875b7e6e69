"""Follow a llama-server log file for what its HTTP endpoints do not tell.

Current llama.cpp prints the load-time lines (offloaded layers, model/KV buffer
sizes) only at `-lv 4`; the per-request timing lines, slot releases and the KV
pressure warnings print at the default verbosity. Both the plain format
(`M.SS.mmm.uuu I <text>`) and `--log-jsonl` are understood.

The follower is polled from the scrape (no timer of its own): each poll reads
what was appended since the last one, at most `max_bytes`, so a huge log is
caught up over several scrapes instead of stalling one.

Rotation: llama-server opens `--log-file` with `fopen(path, "w")`, not for appending,
so after a rotation empties the file in place the next write lands at the old offset
and the file starts with a hole as long as everything written before. The follower
notices the truncation, jumps over the hole (`SEEK_DATA` where the file system has it,
and skips runs of NUL bytes where it has not), buffers at most one line of
`MAX_LINE_BYTES`, and keeps its state: the server process is the same, so its load-time
facts still hold and its counters continue, monotonic across any number of rotations
(only a new process's own init line starts the per-process state over).
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from core.prefill import PrefillBusy

MIB = 1024 * 1024
# Last bytes read, compared on each poll to notice a file rewritten in place.
TAIL_BYTES = 64
# The longest line kept: llama-server's lines are far shorter; a longer one is dropped
# whole, so a corrupt log (or one long run of bytes without a newline) cannot grow the
# buffer past this.
MAX_LINE_BYTES = 256 * 1024
# Read in pieces of this size so a poll never holds more than one piece at a time.
READ_CHUNK = MIB
# NUL bytes (a hole written out by a copy) skipped per poll on top of `max_bytes`.
MAX_SKIP_BYTES = 256 * MIB

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
# The last of a request's timing lines: it prints when the request ends, `total` ms after its
# prompt began.
_TOTAL = re.compile(rf"total time =\s+{_NUM} ms /")
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
# `llama_kv_cache: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB,
# V (%s): %7.2f MiB` (src/llama-kv-cache.cpp); an MLA model's V-less cache may omit V.
_KV_TYPES = re.compile(r"llama_kv_cache: size = .*?K \((\w{1,16})\):(?:.*?V \((\w{1,16})\):)?")
# `tensor %s (%zu MiB %s) buffer type overridden to %s` (llama-model-loader.cpp, debug: -lv 5),
# printed for --n-cpu-moe / --cpu-moe / -ot ...=CPU, once per load pass.
_OVERRIDE = re.compile(
    r"tensor (blk\.(\d{1,6})\.\S{1,96}_(?:ch)?exps\.\S{1,16}) \((\d{1,12}) MiB \w{1,16}\) "
    r"buffer type overridden to (\S{1,64})"
)
# From `common_speculative_init_result: loading draft model '...'` until the server is set up,
# the load lines describe the draft model, not the target.
_DRAFT_START = "loading draft model"
_DRAFT_END = ("speculative decoding context initialized", "load_model: initializing, n_slots")
# Per request (server-context.cpp print_timings): `draft acceptance = %0.5f (%5d accepted /
# %5d generated), mean len = %5.2f`; older builds say `draft acceptance rate = ...`.
_DRAFT_ACCEPT = re.compile(
    r"draft acceptance(?: rate)? = [\d.]{1,12} \(\s*(\d{1,12}) accepted /\s*(\d{1,12}) generated\)"
)
_TASK = re.compile(r"\| task (-?\d{1,12}) \|")
# Requests whose acceptance the accept length averages over; per-task eval lines kept waiting.
SPEC_WINDOW = 64
MAX_PENDING_TASKS = 64
# Tensors of host-memory expert overrides kept (DeepSeek-V3: 58 layers x 3 tensors).
MAX_OVERRIDES = 4096


def is_host_buffer(name: str) -> bool:
    """Whether a llama.cpp buffer type lives in host memory (CPU, CPU_Mapped, CUDA_Host, ...)."""
    return name.startswith("CPU") or name.endswith("_Host")


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
    # KV element types of the target's cache (`K (q8_0)` ...); None until the KV lines.
    kv_type_k: str | None = None
    kv_type_v: str | None = None
    # Routed-expert tensors overridden to a host buffer: tensor name -> (layer, MiB as logged).
    expert_overrides: dict[str, tuple[int, int]] = field(default_factory=dict)
    # A draft model (-md): its weight buffers per device, its KV buffers, kept apart.
    draft_model_buffer_bytes: dict[str, float] = field(default_factory=dict)
    draft_kv_buffer_bytes: dict[str, float] = field(default_factory=dict)
    # Speculative decoding, per finished request: (decode intervals, accepted draft tokens).
    spec_requests: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=SPEC_WINDOW))
    spec_accepted_total: int = 0
    spec_drafted_total: int = 0
    _load_started: float | None = None
    # KV buffers are logged once per cache (SWA and non-SWA); sum them per device.
    _seen_kv_lines: int = 0
    _in_draft: bool = False
    # Decode intervals of requests whose `draft acceptance` line has not come yet, per task.
    _pending_eval: dict[str, int] = field(default_factory=dict)
    # The union of the requests' prompt spans (`prefill_busy_seconds`), and the prompt ms of
    # requests whose `total time` line has not come yet, per task.
    _busy: PrefillBusy = field(default_factory=PrefillBusy)
    _pending_prompt: dict[str, float] = field(default_factory=dict)

    @property
    def prefill_busy_seconds(self) -> float:
        """Seconds in which a prompt was being computed (the union of the prompt spans): each
        request's span ends `total - prompt` ms before its timing lines, which print at its
        end (the line's timestamp; the time it was read where the log has none)."""
        return self._busy.total

    @property
    def spec_accept_length(self) -> float | None:
        """Mean tokens per target decode step over the last requests with a draft; None if none.

        Every target step yields its own token plus the draft tokens it accepted, so over the
        decode intervals I and accepted tokens A of those requests it is I / (I - A).
        """
        intervals = sum(i for i, _ in self.spec_requests)
        accepted = sum(a for _, a in self.spec_requests)
        if not self.spec_requests or intervals <= 0:
            return None
        return intervals / max(1, intervals - accepted)

    @property
    def draft_weights_bytes(self) -> float | None:
        """Bytes of the draft model's weight buffers, when the log showed a draft load."""
        return sum(self.draft_model_buffer_bytes.values()) or None

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
        if self._feed_load(line):
            return
        if match := _INIT.search(line):
            self.n_slots, self.n_ctx_slot = int(match[1]), int(match[2])
            self.kv_unified = match[3] == "true"
        elif match := _PROMPT_EVAL.search(line):
            self.prompt_seconds += float(match[1]) / 1e3
            self.prompt_tokens += int(match[2])
            self._remember_prompt(line, float(match[1]))
        elif match := _EVAL.search(line):
            self.eval_seconds += float(match[1]) / 1e3
            self.eval_tokens += int(match[2])
            self.eval_intervals += max(0, int(match[2]) - 1)
            self._remember_eval(line, max(0, int(match[2]) - 1))
        elif match := _DRAFT_ACCEPT.search(line):
            self._feed_acceptance(line, int(match[1]), int(match[2]))
        elif match := _TOTAL.search(line):
            self._prompt_span(line, float(match[1]))
        elif match := _RELEASE.search(line):
            self.requests_finished += 1
            if match[1] == "1":
                self.events["slot_truncated"] += 1
        else:
            for event, text in _PRESSURE.items():
                if text in line:
                    self.events[event] += 1

    def _feed_load(self, line: str) -> bool:
        """Load-time lines (layers, buffers, KV types, expert overrides); True when consumed."""
        if _DRAFT_START in line:
            self._in_draft = True
            return True
        if self._in_draft and any(marker in line for marker in _DRAFT_END):
            self._in_draft = False
        if match := _OFFLOADED.search(line):
            if not self._in_draft:
                self.layers_offloaded, self.layers_total = int(match[1]), int(match[2])
        elif match := _MODEL_BUF.search(line):
            buffers = self.draft_model_buffer_bytes if self._in_draft else self.model_buffer_bytes
            if match[1] in buffers or len(buffers) < MAX_DEVICES:
                buffers[match[1]] = float(match[2]) * MIB
        elif match := _KV_BUF.search(line):
            buffers = self.draft_kv_buffer_bytes if self._in_draft else self.kv_buffer_bytes
            dev = match[1]
            if dev in buffers or len(buffers) < MAX_DEVICES:
                buffers[dev] = buffers.get(dev, 0.0) + float(match[2]) * MIB
        elif match := _KV_TYPES.search(line):
            if not self._in_draft:
                self.kv_type_k, self.kv_type_v = match[1], match[2] or "none"
        elif match := _OVERRIDE.search(line):
            known = match[1] in self.expert_overrides
            if not self._in_draft and is_host_buffer(match[4]):
                if known or len(self.expert_overrides) < MAX_OVERRIDES:
                    self.expert_overrides[match[1]] = (int(match[2]), int(match[3]))
        else:
            return False
        return True

    def _remember_prompt(self, line: str, prompt_ms: float) -> None:
        task = _TASK.search(line)
        if task is None:
            return
        if len(self._pending_prompt) >= MAX_PENDING_TASKS:
            self._pending_prompt.clear()  # total lines that never came (a cut log)
        self._pending_prompt[task[1]] = prompt_ms

    def _prompt_span(self, line: str, total_ms: float) -> None:
        """A request's prompt span into the busy union, at its `total time` line."""
        task = _TASK.search(line)
        prompt_ms = self._pending_prompt.pop(task[1], None) if task else None
        if prompt_ms is None:
            return
        ended = _log_seconds(line)
        start = (time.time() if ended is None else ended) - total_ms / 1e3
        self._busy.add(start, start + prompt_ms / 1e3)

    def _remember_eval(self, line: str, intervals: int) -> None:
        """Keep a request's decode intervals until its `draft acceptance` line (same task)."""
        task = _TASK.search(line)
        if task is None:
            return
        if len(self._pending_eval) >= MAX_PENDING_TASKS:
            self._pending_eval.clear()  # acceptance lines that never came (no speculation)
        self._pending_eval[task[1]] = intervals

    def _feed_acceptance(self, line: str, accepted: int, drafted: int) -> None:
        self.spec_accepted_total += accepted
        self.spec_drafted_total += drafted
        task = _TASK.search(line)
        intervals = self._pending_eval.pop(task[1], None) if task else None
        if intervals is not None and intervals >= accepted:
            self.spec_requests.append((intervals, accepted))


class LogFollower:
    """Reads a growing log file incrementally, surviving truncation, holes and replacement."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_bytes: int = 8 * MIB,
        max_skip_bytes: int = MAX_SKIP_BYTES,
    ):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.max_skip_bytes = max_skip_bytes
        self.state = LogState()
        self._offset = 0
        self._inode: int | None = None
        self._partial = b""
        # True while the rest of an over-long line is being skipped up to its newline.
        self._overlong = False
        self._tail = b""
        # Times the file was found truncated, rewritten or replaced (rotations included).
        self.restarts = 0

    def poll(self) -> LogState:
        """Read what was appended since the last poll. Raises OSError when unreadable."""
        # Unbuffered: SEEK_DATA moves the descriptor, which a buffered reader would not see.
        with self.path.open("rb", buffering=0) as fh:
            st = os.fstat(fh.fileno())
            if self._inode != st.st_ino or st.st_size < self._offset or self._rewritten(fh):
                # Rotated (emptied in place, or replaced) or rewritten by a new process: read
                # the file from its start; the state carries on (a new process's init line
                # resets what belongs to the process).
                if self._inode is not None:
                    self.restarts += 1
                self._offset = 0
                self._partial = b""
                self._overlong = False
                self._tail = b""
                self._inode = st.st_ino
            self._read(fh, st.st_size)
        return self.state

    def _read(self, fh: BinaryIO, size: int) -> None:
        """Feed complete lines from `_offset` on: `max_bytes` of text, holes and NULs skipped."""
        budget, skip_budget = self.max_bytes, self.max_skip_bytes
        while self._offset < size and budget > 0:
            data_at = _next_data(fh.fileno(), self._offset, size)
            if data_at != self._offset:
                # Jumped a hole: the bytes before the offset are no longer the ones last read.
                self._offset, self._tail = data_at, b""
            if self._offset >= size:
                break
            fh.seek(self._offset)
            data = fh.read(min(READ_CHUNK, budget))
            if not data:
                break
            self._offset += len(data)
            self._tail = (self._tail + data)[-TAIL_BYTES:]
            text = data.replace(b"\0", b"") if b"\0" in data else data
            if text:
                budget -= len(data)
                self._feed_bytes(text)
            else:
                skip_budget -= len(data)
                if skip_budget <= 0:
                    break

    def _feed_bytes(self, data: bytes) -> None:
        """Split into lines; keep the unfinished last one, up to `MAX_LINE_BYTES`."""
        lines = data.split(b"\n")
        last = lines.pop()
        for i, raw in enumerate(lines):
            if i == 0:
                if self._overlong:
                    self._overlong = False
                    continue
                raw = self._partial + raw
                self._partial = b""
            if len(raw) <= MAX_LINE_BYTES:
                self.state.feed(raw.decode("utf-8", errors="replace"))
        if lines:
            self._partial = b""
        if self._overlong:
            return
        if len(self._partial) + len(last) > MAX_LINE_BYTES:
            # A line longer than any llama-server prints (or a corrupt log): drop it.
            self._partial, self._overlong = b"", True
        else:
            self._partial += last

    def _rewritten(self, fh: BinaryIO) -> bool:
        """Whether the bytes just before our offset are no longer the ones we read there."""
        if not self._tail:
            return False
        fh.seek(self._offset - len(self._tail))
        return fh.read(len(self._tail)) != self._tail


def _next_data(fd: int, offset: int, size: int) -> int:
    """The first offset at or after `offset` that is not in a hole (`size` when none is)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return offset
    try:
        return os.lseek(fd, offset, seek_data)
    except OSError as exc:
        # ENXIO: only a hole from here to the end; EINVAL: no SEEK_DATA on this file system.
        return size if exc.errno == errno.ENXIO else offset
