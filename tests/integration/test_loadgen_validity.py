"""Validity of a run: failed requests, aborted runs, KV exhaustion, bounded time.

Integration tests run the real CLI (`python -m cli.loadgen run`) as a process against the engine
simulators, also as processes, and kill the engine mid-run as an operator's crash would.
Unit tests cover the error classification and the stream parser (fuzzed from a real
llama.cpp stream).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.client import StreamResult, _decode_event, _parse_crlf, parse_events
from loadgen.outcomes import KV_EXHAUSTED, SERVER_ERROR, is_kv_exhausted
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.loadgen import loadgen_process, records_so_far, wait_for_records

CPU = ROOT / "tests" / "fixtures" / "llamacpp-cpu-gemma3-270m"

# -- unit: classification and parsing ---------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # llama.cpp tools/server: decode failure sent to every active slot.
        "{'code': 500, 'message': 'Context size has been exceeded.', 'type': 'server_error'}",
        # llama.cpp: a prompt longer than the slot's context (HTTP 400).
        'HTTP 400: {"error":{"code":400,"message":"the request exceeds the available context '
        'size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":700,'
        '"n_ctx":256}}',
        # llama.cpp with context shift enabled.
        "{'code': 400, 'message': 'input (700 tokens) is larger than the max context size "
        "(256 tokens). skipping', 'type': 'exceed_context_size_error'}",
        # SGLang: a prompt beyond the model's context length.
        'HTTP 400: {"object":"error","message":"The input (9000 tokens) is longer than the '
        'model\'s context length (8192 tokens).","type":"BadRequestError","code":400}',
    ],
)
def test_engine_messages_are_kv_exhausted(text: str) -> None:
    assert is_kv_exhausted(text)


@pytest.mark.parametrize("text", [None, "", "HTTP 500: injected failure", "Loading model"])
def test_other_errors_are_not_kv_exhausted(text: str | None) -> None:
    assert not is_kv_exhausted(text)


def test_llamacpp_error_event_in_a_stream_is_a_server_error() -> None:
    # llama.cpp (tools/server) ends a stream with `data: {"error": {...}}`.
    body = (
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
        b'data: {"error":{"code":500,"message":"Context size has been exceeded.",'
        b'"type":"server_error"}}\n\n'
    )
    result = StreamResult()
    parse_events([body], [1.0], result)
    assert result.error == SERVER_ERROR and is_kv_exhausted(result.error_detail)


def test_llamacpp_error_field_in_a_stream_is_a_server_error() -> None:
    # Older llama.cpp builds wrote an error inside an open stream as an SSE `error:` line.
    body = (
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
        b'error: {"code":500,"message":"Context size has been exceeded.","type":"server_error"}'
        b"\n\n"
    )
    result = StreamResult()
    parse_events([body[:20], body[20:]], [1.0, 2.0], result)
    assert result.error == SERVER_ERROR
    assert is_kv_exhausted(result.error_detail)
    assert result.chunk_times == [2.0]
    assert _decode_event(b"error: plain text") == b'{"error":"plain text"}'


STREAM = (CPU / "chat_stream.txt").read_bytes()


def _whole(body: bytes) -> StreamResult:
    result = StreamResult()
    parse_events([body], [0.0], result)
    return result


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_parse_is_the_same_however_the_reads_split(cuts: list[int]) -> None:
    """The real llama.cpp stream split at any points parses to the same result."""
    points = sorted(set(cuts))
    parts = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    stamps = [float(i) for i in range(len(parts))]
    split = StreamResult()
    parse_events(parts, stamps, split)
    whole = _whole(STREAM)
    assert (split.usage, split.finish_reason, split.done, split.error) == (
        whole.usage,
        whole.finish_reason,
        whole.done,
        whole.error,
    )
    assert len(split.chunk_times) == len(whole.chunk_times) > 0
    assert split.chunk_times == sorted(split.chunk_times)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_mutated_streams_never_raise(data: st.DataObject) -> None:
    """Byte mutations of the real stream: the parser records an error or a result, never raises."""
    body = bytearray(STREAM)
    for _ in range(data.draw(st.integers(min_value=1, max_value=8))):
        pos = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
        body[pos] = data.draw(st.integers(min_value=0, max_value=255))
    result = StreamResult()
    parse_events([bytes(body)], [0.0], result)
    assert result.error is None or isinstance(result.error_detail, str)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_one_split_parse_equals_the_per_read_buffer(data: st.DataObject) -> None:
    """The whole-stream split stamps every event as a per-read buffer would, on real bytes.

    The per-read buffer (`_parse_crlf`, also used for LF-only streams here) is the reference:
    the stream cut into random reads, with random bytes changed (some become "\n"), must give
    the same chunk stamps, usage, finish reason, end and error under both.
    """
    body = bytearray(STREAM)
    for _ in range(data.draw(st.integers(min_value=0, max_value=6))):
        pos = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
        body[pos] = data.draw(st.sampled_from([ord("\n"), ord("x"), ord("}"), ord(":")]))
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(body)), max_size=40))
    # Reads that end inside an event's terminator, between its two "\n" (or right after it).
    # (The real stream has dozens of terminators; six changed bytes leave most of them.)
    middles = [i + 1 for i in range(len(body) - 1) if body[i : i + 2] == b"\n\n"]
    cuts += data.draw(st.lists(st.sampled_from(middles), max_size=12))
    cuts += [i + 1 for i in data.draw(st.lists(st.sampled_from(middles), max_size=4))]
    points = sorted(set(cuts))
    parts = [bytes(body[a:b]) for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    stamps = [float(i) for i in range(len(parts))]
    fast, reference = StreamResult(), StreamResult()
    parse_events(parts, stamps, fast)
    _parse_crlf(parts, stamps, reference)
    assert fast == reference


# -- integration: the CLI against simulator processes -----------------------------------------


def _start_sim(kind: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = get_free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--kind", kind, "--port", str(port), *extra],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{kind} simulator did not start")


def _loadgen(out: Path, *args: str) -> subprocess.Popen[str]:
    return loadgen_process("run", "--out", str(out), "--metrics-port", "0", "--no-progress", *args)


def _signal_mid_run(
    sim: subprocess.Popen[bytes], sig: signal.Signals, out: Path, *args: str
) -> tuple[subprocess.Popen[str], str, str, float]:
    """Start a run, send `sig` to the engine once six requests finished, wait for the run:
    (the run, its stdout, its stderr, seconds from the signal to its end)."""
    proc = _loadgen(out, *args)
    wait_for_records(out, 6)
    sim.send_signal(sig)
    t_signal = time.monotonic()
    stdout, stderr = proc.communicate(timeout=60)
    return proc, stdout, stderr, time.monotonic() - t_signal


@pytest.mark.parametrize("kind", ["llamacpp", "sglang"])
def test_engine_killed_mid_run_exits_non_zero_in_bounded_time(kind: str, tmp_path: Path) -> None:
    """The issue's reproduction: 39 requests, the engine dies after a few finished."""
    sim, url = _start_sim(kind, "-np", "4", "--time-scale", "0.2")
    try:
        proc, out, err, seconds = _signal_mid_run(
            sim,
            signal.SIGKILL,
            tmp_path,
            *("--url", url, "--kind", kind, "--concurrency", "4", "--requests", "39"),
            *("--prompt-tokens", "32", "--max-tokens", "24"),
        )
        assert seconds < 20, "the run did not end soon after the engine died"
    finally:
        if sim.poll() is None:
            sim.kill()
        sim.wait(10)
    assert proc.returncode == 1, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["valid"] is False and summary["aborted"] is True
    reason = summary["abort_reason"]
    assert reason.startswith("step 0: ") and ("engine gone" in reason or "too many" in reason)
    step = summary["steps"][0]
    assert step["valid"] is False and step["requests_failed"] > 0
    assert any("requests failed" in r for r in summary["invalid_reasons"])
    assert f"ABORTED: {reason}" in out and "INVALID:" in out
    assert out.count("Result: VALID") == 0


def test_kv_exhausted_requests_are_counted(tmp_path: Path) -> None:
    """Prompts longer than the per-slot context (-c 512 over 4 slots): llama.cpp refuses them
    with `exceed_context_size_error`; every record and the step count them as kv_exhausted."""
    sim, url = _start_sim("llamacpp", "-np", "4", "-c", "512", "--tokenizer", "word")
    prompt = tmp_path / "long.txt"
    prompt.write_text("word " * 300)  # 300 tokens > 512 / 4 per slot
    try:
        proc = _loadgen(
            tmp_path / "o",
            *("--url", url, "--kind", "llamacpp", "--concurrency", "2", "--requests", "6"),
            *("--prompt-file", str(prompt), "--max-tokens", "8", "--max-errors", "1"),
        )
        out, err = proc.communicate(timeout=60)
    finally:
        sim.kill()
        sim.wait(10)
    assert proc.returncode == 3, err
    records = records_so_far(tmp_path / "o")
    assert [r["error"] for r in records] == [KV_EXHAUSTED] * 6
    assert all("context size" in r["error_detail"] for r in records)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    step = summary["steps"][0]
    assert step["kv_exhausted"] == 6 and step["errors"] == {KV_EXHAUSTED: 6}
    assert summary["valid"] is False and summary["aborted"] is False
    assert "6 of 6 requests failed (kv_exhausted 6)" in summary["invalid_reasons"][0]
    assert "kv_exhausted:" in out


def test_engine_that_stops_answering_is_aborted_in_bounded_time(tmp_path: Path) -> None:
    """SIGSTOP: the engine's socket still accepts connections but nothing answers."""
    sim, url = _start_sim("llamacpp", "-np", "4", "--time-scale", "0.2")
    try:
        proc, _out, err, seconds = _signal_mid_run(
            sim,
            signal.SIGSTOP,
            tmp_path,
            *("--url", url, "--kind", "llamacpp", "--concurrency", "4", "--requests", "400"),
            *("--prompt-tokens", "32", "--max-tokens", "24", "--timeout", "3"),
        )
        # One round of 3 s timeouts (plus the requests already in flight), not 400 of them.
        assert seconds < 15
    finally:
        sim.send_signal(signal.SIGCONT)
        sim.kill()
        sim.wait(10)
    assert proc.returncode == 1, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["aborted"] is True and summary["valid"] is False
    assert "engine not answering" in summary["abort_reason"], summary["abort_reason"]
    assert summary["steps"][0]["errors"]["timeout"] >= 4
