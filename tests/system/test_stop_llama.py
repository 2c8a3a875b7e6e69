"""A real llama-server killed mid-run: `run` and `diagnose` write their results within seconds.

What is real: llama-server (CPU build, Gemma 3 270M), the load generator and diagnose as
processes, the signal. llama-server answers SIGTERM by refusing new connections while a
stream it was serving stays open and silent; before the in-flight requests were cancelled
at the stop, that one request sat out the whole `--timeout` (600 s) before the results.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from tests.plugins.llama import LlamaServer
from tests.plugins.loadgen import loadgen_process, records_so_far, wait_for_records

pytestmark = pytest.mark.llamaserver

# Engine-side outcomes of a request to an engine that went away, and the stop's own mark.
GONE = {"connect_error", "disconnected", "http_error", "cancelled"}
LOAD = ("--max-tokens", "32", "--prompt-tokens", "48", "--timeout", "600")


def _stopped_at(stderr: str) -> float:
    """Unix time of the scheduler's stop decision ("...; stopping") in the run's log."""
    line = next(ln for ln in stderr.splitlines() if "; stopping" in ln)
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    assert stamp, line
    return datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(stamp[2]) / 1e3


def _kill_mid_run(server: LlamaServer, proc: subprocess.Popen[str], out: Path) -> str:
    """SIGTERM the engine once a request finished; the run's stderr, once it ended."""
    wait_for_records(out, 1, timeout=120)
    server.proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        server.stop(signal.SIGKILL)
    return stderr


def test_run_writes_its_results_within_seconds_of_the_stop(
    tmp_path: Path, llama_server: Callable[..., LlamaServer]
) -> None:
    server = llama_server(ctx=2048, parallel=2)
    out = tmp_path / "run"
    proc = loadgen_process("run", "--url", server.url, "--kind", "llamacpp", "--out", str(out),
                           "--metrics-port", "0", "--no-progress", "--concurrency", "2",
                           "--requests", "40", "--endpoint", "completions", *LOAD)  # fmt: skip
    stderr = _kill_mid_run(server, proc, out)
    assert proc.returncode == 1, stderr
    summary_written = (out / "summary.json").stat().st_mtime
    assert summary_written - _stopped_at(stderr) < 10, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["aborted"] is True
    records = records_so_far(out)
    # Every request sent has its record: finished, or marked with why it did not.
    assert records[0]["error"] is None
    assert {r["error"] for r in records[1:]} <= GONE | {None}
    assert any(r["error"] in GONE for r in records)


def test_diagnose_writes_the_finished_steps_within_seconds_of_the_stop(
    tmp_path: Path, llama_server: Callable[..., LlamaServer]
) -> None:
    server = llama_server(ctx=2048, parallel=2)
    out = tmp_path / "diag"
    proc = loadgen_process("diagnose", "--url", server.url, "--kind", "llamacpp", "--out",
                           str(out), "--concurrency", "1,2", "--kv-prompt-tokens", "0",
                           "--requests-per-slot", "20", *LOAD)  # fmt: skip
    t0 = time.time()
    stderr = _kill_mid_run(server, proc, out)
    assert proc.returncode == 1, stderr
    written = (out / "results.json").stat().st_mtime
    assert written - _stopped_at(stderr) < 10, stderr
    assert written > t0
    doc = json.loads((out / "results.json").read_text())
    assert doc["partial"] is True
    engine = doc["engines"][0]
    assert "engine gone" in engine["stopped"] or "not answering" in engine["stopped"]
    assert engine["interrupted"] is False
    stopped_row = next(r for r in engine["rows"] if (r["error"] or "").startswith("stopped: "))
    assert stopped_row["errors"], stopped_row
    records = records_so_far(out)
    assert {r["error"] for r in records} <= GONE | {None}
    assert any(r["error"] in GONE for r in records)
