"""Trace files: Mooncake JSONL and Azure-style CSV, read into `Traffic`.

Mooncake (one JSON object a line): `timestamp` (ms since the trace's start), `input_length`,
`output_length`, `hash_ids` (one id per 512-token block of the prompt; equal ids are a shared
prefix), optional `session_id` and `delay` (ms a later turn waits after the answer to the turn
before; a later turn without `timestamp` is sent that long after that answer). `input_length`
is the whole prompt as sent, history included, so a session's turn repeats the ids of the
turns before it where the trace says so.

Azure (CSV with a header): `TIMESTAMP` (a date-time or seconds), `ContextTokens`,
`GeneratedTokens`; each prompt is its own (no shared prefix).

Errors name the line and the field (`trace.jsonl line 3: input_length: ...`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from datetime import datetime
from typing import Any

from loadgen.traffic.mix import MAX_TOKENS
from loadgen.traffic.model import (
    MOONCAKE_BLOCK_TOKENS,
    UNIQUE_BLOCK_BASE,
    Traffic,
    TrafficError,
    TrafficRequest,
    split_blocks,
)

_MOONCAKE_KEYS = {"timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay"}
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _length(value: Any, where: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        raise TrafficError(
            f"{where}: {field}: a whole number of tokens 1..{MAX_TOKENS}, got {value!r}"
        )
    return value


def _millis(value: Any, where: str, field: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise TrafficError(f"{where}: {field}: milliseconds >= 0, got {value!r}")
    return float(value) / 1000.0


def _mooncake_line(obj: Any, where: str, index: int) -> TrafficRequest:
    if not isinstance(obj, dict):
        raise TrafficError(f"{where}: not a JSON object")
    unknown = sorted(set(obj) - _MOONCAKE_KEYS)
    if unknown:
        raise TrafficError(
            f"{where}: unknown field {unknown[0]!r} (known: {sorted(_MOONCAKE_KEYS)})"
        )
    for key in ("input_length", "output_length"):
        if key not in obj:
            raise TrafficError(f"{where}: {key}: missing")
    prompt = _length(obj["input_length"], where, "input_length")
    output = _length(obj["output_length"], where, "output_length")
    at = _millis(obj.get("timestamp", 0), where, "timestamp")
    think = _millis(obj.get("delay", 0), where, "delay")
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < UNIQUE_BLOCK_BASE for i in ids
    ):
        raise TrafficError(f"{where}: hash_ids: a list of block ids 0..2**40-1, got {ids!r:.80}")
    blocks_needed = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if len(ids) > blocks_needed:
        raise TrafficError(
            f"{where}: hash_ids: {len(ids)} blocks of {MOONCAKE_BLOCK_TOKENS} tokens for "
            f"input_length {prompt} (at most {blocks_needed})"
        )
    # Blocks the trace does not name are this request's own.
    own = [UNIQUE_BLOCK_BASE + index * 4096 + k for k in range(blocks_needed - len(ids))]
    session = obj.get("session_id")
    if session is not None and not isinstance(session, (str, int)):
        raise TrafficError(f"{where}: session_id: a string or an integer, got {session!r:.40}")
    return TrafficRequest(
        at_s=at,
        prompt_tokens=prompt,
        output_tokens=output,
        blocks=split_blocks([*ids, *own], prompt, MOONCAKE_BLOCK_TOKENS),
        session=None if session is None else str(session),
        think_s=think,
    )


def read_mooncake(text: str, name: str) -> Traffic:
    """A Mooncake JSONL trace; blank lines are skipped, anything else must be a request."""
    requests: list[TrafficRequest] = []
    # Each session's turns so far and the last one's time.
    turns: dict[str, tuple[int, float]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise TrafficError(f"{where}: not JSON ({exc})") from None
        req = _mooncake_line(obj, where, len(requests))
        session = req.session
        if session is not None:
            turn, before = turns.get(session, (0, 0.0))
            if turn:
                # A later turn goes `delay` after the answer before it: without a timestamp
                # (AIPerf's multi-turn form) it follows that turn, and it never comes first.
                at = req.at_s if "timestamp" in obj else before
                req = dataclasses.replace(req, at_s=max(at, before))
            turns[session] = (turn + 1, req.at_s)
            req = dataclasses.replace(req, turn=turn)
        requests.append(req)
    if not requests:
        raise TrafficError(f"{name}: no requests (an empty trace)")
    return _in_time_order(Traffic(name, tuple(requests)))


def _in_time_order(traffic: Traffic) -> Traffic:
    """Requests sorted by arrival (stable: a trace's order breaks ties), offsets from 0."""
    ordered = sorted(traffic.requests, key=lambda r: r.at_s)
    start = ordered[0].at_s
    shifted = tuple(dataclasses.replace(r, at_s=r.at_s - start) for r in ordered)
    return Traffic(traffic.source, shifted, traffic.scheduled, traffic.concurrency)


def _azure_time(value: str, where: str) -> float:
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            # Azure's traces: `2023-11-16 18:15:46.6805900` (7 fraction digits: cut to 6).
            head, _, frac = text.partition(".")
            moment = datetime.fromisoformat(head + ("." + frac[:6] if frac else ""))
        except ValueError:
            raise TrafficError(
                f"{where}: TIMESTAMP: a date-time (2023-11-16 18:15:46.68) or seconds, "
                f"got {value!r:.40}"
            ) from None
        return moment.timestamp()
    if not math.isfinite(seconds):
        raise TrafficError(f"{where}: TIMESTAMP: not a finite number: {value!r}")
    return seconds


def _azure_int(value: str, where: str, column: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise TrafficError(f"{where}: {column}: a whole number, got {value!r:.40}") from None
    return _length(number, where, column)


def read_azure(text: str, name: str) -> Traffic:
    """An Azure-style CSV trace (`TIMESTAMP,ContextTokens,GeneratedTokens`)."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except (StopIteration, csv.Error):
        raise TrafficError(
            f"{name} line 1: no header (expected {','.join(_AZURE_COLUMNS)})"
        ) from None
    missing = [c for c in _AZURE_COLUMNS if c not in header]
    if missing:
        raise TrafficError(f"{name} line 1: missing column {missing[0]} (header: {header})")
    cols = [header.index(c) for c in _AZURE_COLUMNS]
    requests: list[TrafficRequest] = []
    try:
        for row in reader:
            where = f"{name} line {reader.line_num}"
            if not any(cell.strip() for cell in row):
                continue
            if len(row) < len(header):
                raise TrafficError(f"{where}: {len(row)} fields, the header has {len(header)}")
            at = _azure_time(row[cols[0]], where)
            prompt = _azure_int(row[cols[1]], where, "ContextTokens")
            output = _azure_int(row[cols[2]], where, "GeneratedTokens")
            block = UNIQUE_BLOCK_BASE + len(requests) * 4096
            requests.append(TrafficRequest(at, prompt, output, ((block, prompt),)))
    except csv.Error as exc:
        raise TrafficError(f"{name} line {reader.line_num}: {exc}") from None
    if not requests:
        raise TrafficError(f"{name}: no requests (only a header)")
    return _in_time_order(Traffic(name, tuple(requests)))
