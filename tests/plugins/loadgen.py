"""Fixtures and helpers for the load generator's tests against the streaming stub.

* `stub` (function): a factory `stub(**StubOptions)` that starts a streaming stub in a
  background thread of this process (worker processes reach it over HTTP); all are stopped at
  teardown.
* `run_cli(out, *args)`: `llmb-loadgen run` writing into `out`, no metrics port, no progress bar.
* `request_lines(out)`: the records of `out/requests.jsonl`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loadgen.__main__ import main
from simulator.stub import StubOptions, ThreadedStub

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
