"""One load setting (`RunSpec`): shape, lengths, limits and the request parameters sent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadgen.target import Target
from loadgen.traffic.model import Traffic

DEFAULT_REQUESTS = 32
OPEN_LOOP_MAX_IN_FLIGHT = 1024


@dataclass
class RunSpec:
    """One load setting. `concurrency` is the closed-loop width, or with `rate` a cap."""

    targets: list[Target]
    max_tokens: int = 128
    concurrency: int | None = 1
    rate: float | None = None
    arrival: str = "poisson"  # poisson | constant (open loop only)
    # Closed loop: seconds over which the `concurrency` workers start, evenly (0: together).
    ramp_up: float = 0.0
    requests: int | None = None
    duration: float | None = None
    warmup: int = 0
    timeout: float = 600.0
    endpoint: str = "chat"  # chat | completions
    cache: str = "unique"  # unique | same
    prompt_tokens: int | None = 512
    prompt_text: str | None = None  # from --prompt-file; wins over prompt_tokens
    seed: int = 1234
    connect_timeout: float = 5.0
    abort_after_connect_errors: int = 20
    # Abort the step when more than this share of its finished requests failed (None: never).
    max_error_share: float | None = None
    # Hard limit of one engine's phase in seconds (None: derived, see `phase_deadline()`).
    step_timeout: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    # Worker processes (`--workers`): this share sends prompt/record indexes
    # index_start + i * index_step, so the shares never repeat a prompt and merge into 0..n-1.
    index_start: int = 0
    index_step: int = 1
    # Open loop: seed and start offset of this share's arrival clock (None: `seed`), so the
    # shares do not fire in lockstep. Closed loop with `ramp_up`: the offset of this share's
    # first start, so the shares' ramps interleave.
    arrival_seed: int | None = None
    arrival_offset: float = 0.0
    # --traffic: the requests to replay (prompt and output lengths per request, arrival
    # times), `time_scale` stretching the schedule, `schedule=False` (--no-schedule) sending
    # them as fast as `concurrency` allows.
    traffic: Traffic | None = None
    time_scale: float = 1.0
    schedule: bool = True

    def open_loop(self) -> bool:
        """Requests start on a clock (a rate, a replayed schedule), not when others end."""
        if self.traffic is not None:
            return self.schedule and self.traffic.scheduled
        return self.rate is not None

    def request_params(self) -> dict[str, Any]:
        """Sampling parameters sent with every request (output length exact, deterministic)."""
        params: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "seed": self.seed,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        params.update(self.extra_body)
        return params

    def pool_size(self) -> int:
        """Connections to pre-open: one per request that can be in flight."""
        if not self.open_loop():
            return max(1, self.concurrency or 1)
        return max(1, min(self.concurrency or OPEN_LOOP_MAX_IN_FLIGHT, OPEN_LOOP_MAX_IN_FLIGHT))

    def preopen_count(self) -> int:
        """Connections worth opening before a phase (open loop: the in-flight count is unknown)."""
        return self.pool_size() if not self.open_loop() else min(self.pool_size(), 64)

    def phase_deadline(self, measured: bool = True) -> float:
        """Seconds one engine's phase may take before it is cut, whatever the engine does.

        `step_timeout` when given; else the worst case of a live engine: the phase's waves
        (requests / concurrency, rounded up) each bounded by the per-request `timeout`, or the
        `duration` plus one `timeout` for the requests in flight at its end.
        """
        if self.step_timeout is not None:
            return self.step_timeout
        if measured and self.duration is not None:
            return self.duration + self.timeout + self.connect_timeout
        if measured and self.traffic is not None:
            return self._replay_deadline(self.traffic)
        count = (self.request_limit() if measured else self.warmup) or 1
        if self.rate is not None:
            # Arrivals alone take count / rate; the last request then has its own timeout.
            return count / self.rate + self.timeout + self.connect_timeout
        waves = -(-count // max(1, self.concurrency or 1))
        return self.ramp_up + waves * (self.timeout + self.connect_timeout)

    def _replay_deadline(self, traffic: Traffic) -> float:
        """A replay's worst case: its schedule, then every turn of the longest session (or,
        closed, every wave) bounded by `timeout` and think time."""
        per = self.timeout + self.connect_timeout
        turns = max((len(t) for t in traffic.sessions().values()), default=1)
        think = max(r.think_s for r in traffic.requests) * self.time_scale
        if self.open_loop():
            return traffic.span_s() * self.time_scale + turns * (per + think)
        waves = -(-len(traffic.requests) // max(1, self.concurrency or 1))
        # A worker's later turns each think after the answer before them.
        return (waves + turns) * per + waves * think

    def start_delay(self, slot: int) -> float:
        """Closed loop: seconds before worker `slot` (0-based) sends its first request."""
        if not self.ramp_up:
            return 0.0
        return self.arrival_offset + self.ramp_up * slot / max(1, self.concurrency or 1)

    def request_limit(self) -> int | None:
        """Measured requests to send (None: until `duration`)."""
        if self.traffic is not None:
            return len(self.traffic.requests)
        if self.requests is None and self.duration is None:
            return DEFAULT_REQUESTS
        return self.requests
