"""The log-rotation check shared by the process test (real llama-server, exporter process)
and the compose test (the stack's `llamacpp-logrotate` service).

* `LOG_COUNTERS`: the log-derived counters the exporter serves.
* `log_counters(samples)`: those counters of engine `llama` from a parsed exposition.
* `rss_bytes(pid)`: a process's resident set size.
* `assert_rotations_hold(rotate_and_load, counters, rss)`: five rotations, each followed by
  load: no counter goes down, more requests finish each round, RSS stays flat.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.plugins.exporter import SampleKey, pick

MIB = 1024 * 1024
# The log-derived counters the exporter serves (llmb_engine_* from the log follower).
LOG_COUNTERS = (
    "llmb_engine_prompt_seconds_total",
    "llmb_engine_prefill_busy_seconds_total",
    "llmb_engine_generation_tokens_total",
    "llmb_engine_decode_tokens_total",
    "llmb_engine_decode_seconds_total",
    "llmb_engine_requests_finished_total",
)


def log_counters(samples: dict[SampleKey, float]) -> dict[str, float]:
    """The `LOG_COUNTERS` of engine `llama`; each must be there."""
    out = {}
    for name in LOG_COUNTERS:
        values = pick(samples, name, engine="llama")
        assert values, f"{name} missing"
        out[name] = values[0]
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def assert_rotations_hold(
    rotate_and_load: Callable[[], None],
    counters: Callable[[], dict[str, float]],
    rss: Callable[[], int],
    rounds: int = 5,
) -> None:
    """Rotate the log `rounds` times, with load after each: every counter is monotonic,
    requests finished grows each round, and RSS stays within 20 MiB of the start."""
    previous = counters()
    start_rss = rss()
    for _ in range(rounds):
        rotate_and_load()
        current = counters()
        for name, value in current.items():
            assert value >= previous[name], (name, previous[name], value)
        assert (
            current["llmb_engine_requests_finished_total"]
            > (previous["llmb_engine_requests_finished_total"])
        )
        previous = current
        assert abs(rss() - start_rss) < 20 * MIB
