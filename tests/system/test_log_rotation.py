"""The llama-server log follower across rotations (issue 19).

llama-server opens `--log-file` with `fopen(path, "w")`: after a rotation empties the file
in place, its next write lands at the old offset and the file starts with a hole. The
follower must jump the hole (or a run of real NULs, as a copy writes it out), buffer at
most one line, and keep its counters monotonic. The last test shows it with the real CPU
llama-server and the real exporter process.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.collectors.llamacpp.log import MAX_LINE_BYTES, MIB, LogFollower, LogState
from tests.paths import FIXTURES
from tests.plugins.exporter import ExporterProcess
from tests.plugins.llama import LlamaServer
from tests.plugins.rotation import assert_rotations_hold, log_counters, rss_bytes

CPU = FIXTURES / "llamacpp-cpu-gemma3-270m"
LINES = (CPU / "server.log").read_bytes().splitlines(keepends=True)


def rotate(log: Path) -> None:
    """What the compose `llamacpp-logrotate` service does: copy without the hole, empty."""
    with log.open("rb") as src, log.with_name(log.name + ".1").open("wb") as dst:
        while chunk := src.read(MIB):
            dst.write(chunk.replace(b"\0", b""))
    with log.open("r+b") as fh:
        fh.truncate(0)


def _poll_peak(follower: LogFollower) -> tuple[LogState, int]:
    """One poll, and the peak memory it allocated (tracemalloc)."""
    tracemalloc.start()
    try:
        state = follower.poll()
        return state, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_hole_after_truncation_is_jumped_and_the_counters_carry_on(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"".join(LINES))
    follower = LogFollower(log)
    before = follower.poll()
    tokens, layers = before.eval_tokens, before.n_slots
    assert tokens > 0 and layers
    rotate(log)
    # The server keeps writing at its own offset, 1 GiB on: a 1 GiB hole before the line.
    timing = next(line for line in LINES if b" eval time =" in line and b"prompt" not in line)
    with log.open("r+b") as fh:
        fh.seek(1024 * MIB)
        fh.write(timing)
    after, peak = _poll_peak(follower)
    assert after.eval_tokens > tokens  # counted once more, not started over
    assert after.n_slots == layers  # the load-time facts of the same process stay
    assert peak < 4 * MIB
    assert follower.restarts == 1


def test_real_nul_bytes_are_skipped_within_bounds(tmp_path: Path) -> None:
    """A file system without holes gets real NULs: skipped, never buffered as a line."""
    log = tmp_path / "server.log"
    log.write_bytes(b"\0" * (64 * MIB) + b"".join(LINES))
    follower = LogFollower(log)
    state, peak = _poll_peak(follower)
    assert state.eval_tokens > 0 and state.requests_finished > 0
    assert peak < 4 * MIB
    # More NULs than one poll skips: caught up over later polls, still bounded.
    log.write_bytes(b"\0" * (40 * MIB) + b"".join(LINES))
    short = LogFollower(log, max_skip_bytes=16 * MIB)
    polls = [short.poll().eval_tokens for _ in range(4)]
    assert polls[0] == 0 and polls[-1] == state.eval_tokens


def test_an_overlong_line_is_dropped_not_buffered(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * (10 * MIB))
    follower = LogFollower(log)
    for _ in range(3):
        follower.poll()
        assert len(follower._partial) <= MAX_LINE_BYTES
    with log.open("ab") as fh:
        fh.write(b"tail of the long line\n" + b"".join(LINES))
    state = follower.poll()
    assert state.eval_tokens > 0 and len(follower._partial) <= MAX_LINE_BYTES


def counts(state: LogState) -> tuple[int, int, int, float]:
    return (state.prompt_tokens, state.eval_tokens, state.requests_finished, state.eval_seconds)


BASELINE = counts(LogFollower(CPU / "server.log").poll())


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cuts=st.lists(st.integers(0, len(LINES)), min_size=1, max_size=6),
    hole=st.sampled_from([1, 4095, 4096, 70_000, 3 * MIB]),
    sparse=st.booleans(),
    max_bytes=st.sampled_from([512, 4096, 8 * MIB]),
)
def test_rotations_anywhere_count_every_line_once(
    tmp_path_factory: pytest.TempPathFactory,
    cuts: list[int],
    hole: int,
    sparse: bool,
    max_bytes: int,
) -> None:
    """The real log written in pieces, rotated (emptied in place) between pieces, the writer
    going on at its own offset behind a hole (sparse) or real NULs: every line once."""
    log = tmp_path_factory.mktemp("rot") / "server.log"
    log.write_bytes(b"")
    follower = LogFollower(log, max_bytes=max_bytes)
    offset, done = 0, 0
    for cut in [*sorted(cuts), len(LINES)]:
        piece = b"".join(LINES[done:cut])
        done = max(done, cut)
        with log.open("r+b") as fh:
            fh.truncate(0)  # rotation: the writer's own offset stays where it was
            if not sparse:
                fh.write(b"\0" * (offset + hole))
            fh.seek(offset + hole)
            fh.write(piece)
        offset += hole + len(piece)
        # The follower keeps up between rotations (what the rotation interval is for): a poll
        # reads `max_bytes` of text, so a small budget needs more polls per piece. Lines still
        # unread when the file is emptied live on in the rotated copy, not in this file.
        for _ in range(8 + len(piece) // max_bytes + 1):
            follower.poll()
    for _ in range(64):  # small max_bytes: caught up over more polls
        follower.poll()
    assert counts(follower.state) == pytest.approx(BASELINE)
    assert len(follower._partial) <= MAX_LINE_BYTES


def chat(server: LlamaServer, n: int) -> None:
    for i in range(n):
        body = {"prompt": f"Count to {i + 3}:", "n_predict": 8, "cache_prompt": False}
        httpx.post(server.url + "/completion", json=body, timeout=60).raise_for_status()


@pytest.mark.timeout(300)
def test_five_rotations_of_a_real_llama_server_log(
    llama_server: Callable[..., LlamaServer],
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
) -> None:
    """Real llama-server (-lv 4 --log-file), real exporter: RSS flat, no counter goes down."""
    server = llama_server()
    engine = {"name": "llama", "kind": "llamacpp", "url": server.url, "log_file": str(server.log)}
    exporter = exporter_process({"engines": [engine]})
    chat(server, 2)

    def rotate_and_chat() -> None:
        rotate(server.log)
        chat(server, 2)

    assert_rotations_hold(
        rotate_and_chat,
        lambda: log_counters(exporter.scrape()),
        lambda: rss_bytes(exporter.proc.pid),
    )
    rotated = server.log.with_name(server.log.name + ".1").read_bytes()
    assert b"\0" not in rotated and b"release" in rotated


def test_a_trailing_hole_is_not_taken_for_a_rewrite(tmp_path: Path) -> None:
    """A file extended by a hole only (no data yet) is read on, never counted twice."""
    log = tmp_path / "server.log"
    log.write_bytes(b"".join(LINES))
    follower = LogFollower(log)
    tokens = follower.poll().eval_tokens
    with log.open("r+b") as fh:
        fh.truncate(len(b"".join(LINES)) + 8 * MIB)
    assert follower.poll().eval_tokens == tokens
    assert follower.poll().eval_tokens == tokens and follower.restarts == 0
