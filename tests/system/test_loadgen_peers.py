"""bench/loadgen_peers.py in its short form (one round, small counts): llmb-loadgen, AIPerf,
inference-perf and the bare client each ran against the injected-delay stub, from their own
processes (the peers from the venvs scripts/install-peers.sh builds), and each produced numbers
from its own per-request records. The full comparison is the documented command
(docs/benchmarks.md); this checks that every tool still runs and is read correctly."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.loadgen_peers import TIMING_ONLY
from bench.peer_tools import TOOLS
from bench.peer_venvs import PEERS, missing_reason

pytestmark = [pytest.mark.peers, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]


def test_every_tool_ran_and_produced_numbers(tmp_path: Path) -> None:
    reasons = [r for peer in PEERS.values() if (r := missing_reason(peer))]
    assert not reasons, "; ".join(reasons)
    out = tmp_path / "peers.json"
    cmd = [sys.executable, "bench/loadgen_peers.py", "--rounds", "1",
           "--throughput-concurrency", "8", "--short-requests", "64", "--long-requests", "16",
           "--long-tokens", "32", "--timing-concurrency", "8", "--json", str(out)]  # fmt: skip
    # A temporary folder of the run's own, to see that every tool's files go with its run
    # (AIPerf leaves its dataset and socket folders in the temporary folder unless pointed
    # elsewhere). Short, not under tmp_path: AIPerf's sockets live there, and a socket's path
    # has a 107-byte limit.
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch:
        env = os.environ | {"TMPDIR": scratch}
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840, env=env)
        left = os.listdir(scratch)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert not left, f"left behind in the temporary folder: {left}"
    data = json.loads(out.read_text())
    assert data["versions"]["aiperf"] == PEERS["aiperf"].version
    assert data["versions"]["inference-perf"] == PEERS["inference-perf"].version
    shapes = {s["name"]: s for s in data["shapes"]}
    assert set(shapes) == {"short", "long", "timing-8"}
    rows = {(r["shape"], r["tool"]): r for r in data["rows"]}
    # The paced variant is an offered load for the timing shapes only.
    want = {(s, t) for s in shapes for t in TOOLS if shapes[s]["delays"] or t not in TIMING_ONLY}
    assert set(rows) == want
    for (name, tool), row in rows.items():
        shape = shapes[name]
        where = f"{tool} on {name}"
        assert row["requests"] == shape["requests"], where  # every request finished and read
        assert row["requests_per_s"] > 0 and row["cpu_us_per_request"] >= 0, where
        # Every request streamed max_tokens content chunks, as the tool itself counted them.
        per_request = row["chunks_per_s"] / row["requests_per_s"]
        assert per_request == pytest.approx(shape["max_tokens"], rel=0.01), where
        if shape["delays"]:
            # The stub sends the first token 200 ms after the request arrived: no tool can
            # see it earlier (1 ms for clock granularity), and every error is a finite number.
            assert row["ttft_err_p50_ms"] > -1.0, where
            keys = ("ttft_err_p99_ms", "itl_p99_err_p50_ms", "itl_p99_err_p99_ms")
            assert all(math.isfinite(row[k]) for k in keys), where
        # The concurrency a tool held is at most the one asked for (inference-perf's paced
        # 1-token requests hold well under one).
        assert 0 < row["mean_in_flight"] <= shape["concurrency"] + 0.5, where
