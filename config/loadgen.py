"""The config file's `loadgen:` section: defaults for the load generator's flags.

Keys are the flag names with `_` (`max_tokens: 128` for `--max-tokens`). One mapping serves
every subcommand: a key is applied where the command has that flag and ignored by the others;
a key that no subcommand knows is an error when the file is loaded (the exporter's
`loadgen.KEY: unknown key`). Here a value is checked for its shape; when applied it goes
through the flag's own parser, so it means exactly what the flag would.

Only pydantic and the engine kinds are imported: the exporter validates this section without
the load generator.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from config.kinds import kind_choice

# `--kind`: a registered kind (config/kinds.py) or a plain OpenAI-compatible server.
TargetKind = Annotated[str, BeforeValidator(partial(kind_choice, generic=True))]

# A comma-list flag (`--concurrency 1,2,4`): `4`, `[1, 2]` or `'1,2'`.
IntList = int | list[int] | str


class LoadgenSettings(BaseModel):
    """The `loadgen:` mapping; every field is a flag of `run`, `sweep`, `served-mix`,
    `diagnose`, `compare` or `decide`."""

    # allow_inf_nan=False: `1e400` is YAML for infinity, never a meant value.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # target
    engine: list[str] | None = None
    url: str | None = None
    kind: TargetKind | None = None
    name: str | None = None
    api_key_env: str | None = None
    model: str | None = None
    # load (run, sweep)
    concurrency: IntList | None = None
    prompt_tokens: IntList | None = None
    grid: bool | None = None
    pause: float | None = None
    rate: float | None = None
    arrival: Literal["poisson", "constant"] | None = None
    ramp_up: float | None = Field(default=None, ge=0)
    requests: int | None = None
    duration: float | None = None
    warmup: int | None = None
    timeout: float | None = None
    connect_timeout: float | None = None
    max_errors: float | None = None
    workers: int | None = None
    # prompt and request
    prompt_file: str | None = None
    max_tokens: int | None = None
    endpoint: Literal["chat", "completions"] | None = None
    cache: Literal["unique", "same"] | None = None
    seed: int | None = None
    # output
    out: str | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None
    exporter_url: str | None = None
    prometheus_url: str | None = None
    no_progress: bool | None = None
    # diagnose, compare
    rounds: int | None = None
    requests_per_slot: int | None = None
    contexts: IntList | None = None
    max_context: int | None = None
    kv_prompt_tokens: int | None = None
    settle: float | None = None
    parallel: int | None = None
    exporter_engine: str | None = None
    bandwidth_gbs: float | None = None
    peak_tflops: float | None = Field(default=None, gt=0)
    # --host-bandwidth-gbs's default (diagnose, compare, decide; reported as source "flag").
    host_bandwidth_gbs: float | None = Field(default=None, gt=0)
    fail_on: list[str] | None = None
    # --log-file / --model-path of the engine diagnose measures (compare: give them as flags).
    log_file: str | None = None
    model_path: str | None = None
    # The answer's inputs (compare, diagnose, decide; `slo` also run and sweep's goodput).
    slo: str | None = None
    load: int | None = Field(default=None, ge=1)
    in_use: str | None = None
    find_max: bool | None = None
    # The load from Prometheus (compare, decide): --load-from, --load-window, --load-engine.
    load_from: str | None = None
    load_window: str | None = None
    load_engine: str | None = None
    # Your traffic (run): --traffic SPEC, --time-scale, --no-schedule.
    traffic: str | None = None
    time_scale: float | None = Field(default=None, gt=0)
    no_schedule: bool | None = None
    # The served mix as the traffic (run): --traffic-from, --traffic-window, --traffic-engine.
    traffic_from: str | None = None
    traffic_window: str | None = None
    traffic_engine: str | None = None
    # served-mix: the Prometheus to read, the window and its end (--engine, --out, --seed as
    # above); `at` a Unix time or an RFC 3339 time, as --at takes it.
    prometheus: str | None = None
    window: str | None = None
    at: str | float | None = None

    def given(self) -> dict[str, Any]:
        """The keys the file sets (a null value included), as parsed."""
        return self.model_dump(exclude_unset=True)


__all__ = ["LoadgenSettings"]
