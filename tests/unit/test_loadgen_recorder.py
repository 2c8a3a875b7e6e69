"""The recorder keeps its work off the read path: finished requests are settled (parsed,
written to requests.jsonl, published) in the gaps between network reads, never later than
MAX_DEFER_S, and a due garbage collection waits for a gap too."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest

from loadgen.client import StreamClient, StreamResult
from loadgen.prompts import fixed_prompt
from loadgen.results import JsonlWriter, RequestRecord, build_record
from loadgen.scheduler import pacing
from loadgen.scheduler import phase as phase_module
from loadgen.scheduler.context import RunContext
from loadgen.scheduler.spec import RunSpec
from loadgen.target import Target

TOKENS = 3


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _result(t_end: float) -> StreamResult:
    """An unparsed finished stream of TOKENS tokens, as `stream(parse=False)` returns it."""
    parts = [_sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})]
    parts += [_sse({"choices": [{"index": 0, "delta": {"content": f" t{k}"}}]}) for k in range(3)]
    usage = {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": 5 + TOKENS}
    parts += [_sse({"choices": [], "usage": usage}), b"data: [DONE]\n\n"]
    stamps = [t_end - 0.05 + 0.01 * i for i in range(len(parts))]
    return StreamResult(t_send=t_end - 0.1, t_end=t_end, parts=parts, stamps=stamps, parsed=False)


class _Ctx(RunContext):
    """A run context that notes when each batch of records was published."""

    def __init__(self, out: Path):
        super().__init__(out)
        self.published: list[tuple[float, int]] = []

    def record_many(self, records: Any) -> None:
        self.published.append((time.perf_counter(), len(records)))
        super().record_many(records)


def _phase(tmp_path: Path) -> tuple[phase_module.EnginePhase, StreamClient, _Ctx]:
    ctx = _Ctx(tmp_path)
    spec = RunSpec([Target("e", "http://127.0.0.1:9")], max_tokens=TOKENS, concurrency=4)
    client = StreamClient(spec.targets[0], pool_size=4)
    phase = phase_module.EnginePhase(ctx, spec, client, fixed_prompt("hi"), 0, measured=True)
    return phase, client, ctx


def _recording(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    quiet_s: float,
    max_defer_s: float,
    finished: list[float],
) -> tuple[phase_module.EnginePhase, StreamClient, _Ctx, asyncio.Task[None]]:
    """The recorder task started over one pending record per time in `finished` (not yet run:
    the caller's next await runs it)."""
    monkeypatch.setattr(phase_module, "QUIET_S", quiet_s)
    monkeypatch.setattr(phase_module, "MAX_DEFER_S", max_defer_s)
    phase, client, ctx = _phase(tmp_path)
    recorder = asyncio.create_task(phase._recorder())
    for index, t in enumerate(finished):
        phase._pending.append((index, _result(t)))
    phase._wake.set()
    return phase, client, ctx, recorder


async def _reads(client: StreamClient, seconds: float) -> None:
    """Network reads every millisecond or so (the machine may stretch that a little)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        client.last_read = time.perf_counter()
        await asyncio.sleep(0.001)


async def test_records_wait_for_a_gap_between_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One slice long enough for the five (the 0.5 ms default can end after a cold first
    # settle and split the batch: what is tested here is the wait for a quiet gap).
    monkeypatch.setattr(phase_module, "SETTLE_SLICE_S", 1.0)
    phase, client, ctx, recorder = _recording(
        tmp_path, monkeypatch, 0.05, 5.0, [time.perf_counter() for _ in range(5)]
    )
    client.last_read = time.perf_counter()  # before the recorder first runs
    await _reads(client, 0.4)
    assert phase.records == [] and ctx.published == []  # busy reads: nothing settled yet
    quiet_from = client.last_read
    await asyncio.sleep(0.5)
    recorder.cancel()
    ctx.close()
    assert [r.index for r in phase.records] == list(range(5))
    assert all(r.error is None and r.completion_tokens == TOKENS for r in phase.records)
    # Settled once the reads had been quiet for QUIET_S, in one batch (one write + flush).
    assert len(ctx.published) == 1 and ctx.published[0][0] >= quiet_from + 0.05
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == list(range(5))


async def test_records_are_never_held_longer_than_max_defer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = time.perf_counter()
    phase, client, ctx, recorder = _recording(tmp_path, monkeypatch, 0.2, 0.2, [finished] * 3)
    await _reads(client, 0.8)  # reads that never pause
    recorder.cancel()
    ctx.close()
    assert [r.index for r in phase.records] == [0, 1, 2]
    # Overdue records go one per event-loop turn, not before MAX_DEFER_S.
    assert [n for _, n in ctx.published] == [1, 1, 1]
    assert all(finished + 0.2 <= t < finished + 0.7 for t, _ in ctx.published)


async def test_drain_settles_what_is_left_in_one_batch(tmp_path: Path) -> None:
    phase, _client, ctx = _phase(tmp_path)
    for index in range(4):
        phase._pending.append((index, _result(time.perf_counter())))
    phase._drain()
    ctx.close()
    assert [n for _, n in ctx.published] == [4] and phase.finished == 4
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 4


def test_write_many_flushes_each_batch(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "requests.jsonl")
    records: list[RequestRecord] = [
        build_record(_result(1.0), engine="e", step=0, index=i, max_tokens=TOKENS, wall_offset=0)
        for i in range(3)
    ]
    writer.write_many(records[:2])
    # Flushed at once: a reader (or a crash right now) sees the whole batch.
    text = (tmp_path / "requests.jsonl").read_text()
    assert [json.loads(line)["index"] for line in text.splitlines()] == [0, 1]
    writer.write(records[2])
    writer.write_many([])
    writer.close()
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 3


async def test_a_due_collection_waits_for_quiet_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "GC_INTERVAL_S", 0.05)
    monkeypatch.setattr(pacing, "GC_MAX_DELAY_S", 5.0)
    busy_until = time.perf_counter() + 0.4
    young: list[float] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 1:
            young.append(time.perf_counter())

    def quiet() -> float:
        return max(0.0, busy_until - time.perf_counter())

    gc.callbacks.append(note)
    try:
        with pacing.quiet_gc(True, quiet):
            await asyncio.sleep(0.6)
    finally:
        gc.callbacks.remove(note)
    assert young and young[0] >= busy_until  # not while the reads were busy


def test_bodies_are_built_ahead_within_a_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec([Target("e", "http://127.0.0.1:9")], concurrency=4, requests=100)
    client = StreamClient(spec.targets[0], pool_size=4)
    prompts = fixed_prompt("a prompt " * 50)
    phase = phase_module.EnginePhase(RunContext(tmp_path), spec, client, prompts, 0, measured=True)
    # Two waves of the closed loop ahead, each exactly the body it would build when sent.
    assert sorted(phase._bodies) == list(range(8))
    assert all(phase._bodies[n] == phase._body(n) for n in range(8))
    phase.next_index = 5
    del phase._bodies[0]
    phase.prebuild()
    assert max(phase._bodies) == 12
    size = len(phase._body(0))
    monkeypatch.setattr(phase_module, "PREBUILT_BYTES", 3 * size)
    small = phase_module.EnginePhase(RunContext(tmp_path), spec, client, prompts, 0, measured=True)
    assert sorted(small._bodies) == [0, 1, 2]  # long prompts: fewer ahead
