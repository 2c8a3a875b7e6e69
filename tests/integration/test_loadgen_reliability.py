"""Ctrl-C and a server killed mid-run, with the load generator and the stub as real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.loadgen import loadgen_process


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


@pytest.fixture
def stub_process() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The stub in its own process: 25 ms between tokens."""
    port = get_free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.stub", "--port", str(port), "--itl", "0.025"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    def up() -> bool:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=1):
                return True
        except OSError:
            return False

    _wait_for(up, 20, "the stub to listen")
    yield proc, url
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def _loadgen(url: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    return loadgen_process(
        "run", "--url", url, "--out", str(out), "--metrics-port", "0",
        "--prompt-tokens", "20", "--max-tokens", "20", "--concurrency", "4", *extra,
    )  # fmt: skip


def test_ctrl_c_keeps_everything(stub_process, tmp_path: Path) -> None:
    _, url = stub_process
    proc = _loadgen(url, tmp_path, "--requests", "10000")
    jsonl = tmp_path / "requests.jsonl"
    _wait_for(lambda: len(_lines(jsonl)) >= 8, 30, "8 finished requests")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    lines = _lines(jsonl)
    finished = [r for r in lines if r["error"] is None]
    interrupted = [r for r in lines if r["error"] == "interrupted"]
    assert len(finished) >= 8
    assert 1 <= len(interrupted) <= 4  # the requests in flight at the signal
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["steps"][0]["requests_ok"] == len(finished)
    assert "Run interrupted" in (tmp_path / "summary.md").read_text()
    assert "Median TTFT (ms)" in out and "ABORTED: step 0: interrupted" in out


def test_server_killed_mid_run(stub_process, tmp_path: Path) -> None:
    server, url = stub_process
    proc = _loadgen(url, tmp_path, "--requests", "400")
    jsonl = tmp_path / "requests.jsonl"
    _wait_for(lambda: len(_lines(jsonl)) >= 4, 30, "4 finished requests")
    server.kill()
    t_kill = time.monotonic()
    _out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t_kill < 15  # bounded: the step gives up, the run ends
    lines = _lines(jsonl)
    errors = [r["error"] for r in lines]
    assert errors.count(None) >= 4
    # In-flight streams were cut, then new connections were refused until the step gave up.
    assert "disconnected" in errors and "connect_error" in errors
    assert len(lines) < 400
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["aborted"] is True and summary["valid"] is False
    assert summary["abort_reason"].startswith("step 0: "), summary["abort_reason"]
    assert any(why in summary["abort_reason"] for why in ("too many errors", "engine gone")), (
        summary["abort_reason"]
    )
    assert summary["abort_reason"].split(": ")[1] in err
    step = summary["steps"][0]
    assert step["requests_failed"] == len(lines) - errors.count(None)
    assert step["valid"] is False
    assert proc.returncode == 1, err
