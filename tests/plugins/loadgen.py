"""Fixtures and helpers for the load generator's tests against the streaming stub.

* `stub` (function): a factory `stub(**StubOptions)` that starts a streaming stub in a
  background thread of this process (worker processes reach it over HTTP); all are stopped at
  teardown.
* `run_cli(out, *args)`: `llmb-loadgen run` writing into `out`, no metrics port, no progress bar.
* `request_lines(out)`: the records of `out/requests.jsonl`.
* `records_so_far(out)`: the complete records of a run still writing them.
* `wait_for_records(out, n, timeout)`: block until a running run has written `n` records.
* `loadgen_process(*args)`: `python -m cli.loadgen *args` as a child process (text pipes,
  unbuffered).
* `sample_served_mix(**change)`: a `ServedMix` as `served-mix` reads it (7 requests over 1h of an
  SGLang engine), with the fields in `change` replaced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main
from loadgen.served_mix import Lengths, ServedMix
from simulator.stub import StubOptions, ThreadedStub
from tests.paths import ROOT

StubFactory = Callable[..., ThreadedStub]


@pytest.fixture
def stub() -> Iterator[StubFactory]:
    started: list[ThreadedStub] = []

    def start(**options: Any) -> ThreadedStub:
        server = ThreadedStub(StubOptions(**options)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def run_cli(out: Path, *args: str) -> int:
    """Run `llmb-loadgen run` with its outputs in `out`; return the exit code."""
    return main(["run", "--out", str(out), "--metrics-port", "0", "--no-progress", *args])


def request_lines(out: Path) -> list[dict[str, Any]]:
    """The per-request records a run wrote."""
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def records_so_far(out: Path) -> list[dict[str, Any]]:
    """The complete records of `out/requests.jsonl` while a run may still be writing it."""
    path = out / "requests.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for_records(out: Path, n: int, timeout: float = 60) -> None:
    """Wait until a running run has written `n` complete records; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while len(records_so_far(out)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(records_so_far(out)) >= n, "no request finished"


def loadgen_process(*args: str) -> subprocess.Popen[str]:
    """`python -m cli.loadgen *args` from the repository root, its output in text pipes."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli.loadgen", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )


def sample_served_mix(**change: Any) -> ServedMix:
    """A served mix (see the module's docstring); `change` replaces fields."""
    mix = ServedMix(
        engine="sgl",
        kind="sglang",
        window="1h",
        at=1796612400.0,
        prometheus="http://p:9090",
        prompt=Lengths(120.0, ((100.0, 4.0), (300.0, 3.0)), "h"),
        output=Lengths(30.0, (), "mean"),
        requests=7.0,
        rate_per_second=7 / 3600,
        running_p50=1.0,
        running_p90=1.2,
        cached_share=0.25,
        lacks=("x",),
        seed=7,
    )
    return replace(mix, **change)
