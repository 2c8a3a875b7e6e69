"""Typed summaries: one engine in one step (`StepSummary`) and the run (`RunSummary`).

Both are built here and nowhere else; `to_dict()` is the summary.json document, key for key
in the order the reports have always had. Latency statistics use successful requests only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from importlib import metadata
from typing import Any, Literal

from loadgen.outcomes import EARLY_STOP, KV_EXHAUSTED
from loadgen.results import RequestRecord, mean, percentile, prompt_tokens_off
from loadgen.scheduler.spec import RunSpec
from loadgen.target import Target


class Absent(enum.Enum):
    """A key the summary leaves out (not the same as a null value)."""

    ABSENT = "absent"


ABSENT: Literal[Absent.ABSENT] = Absent.ABSENT

# The server-side figures of one step, as the probe returned them (exporter or Prometheus).
ServerFigures = dict[str, Any]


@dataclass
class StepSummary:
    """One engine in one step: a row of summary.json's `steps`."""

    engine: str
    step: int
    concurrency: int | None
    rate: float | None
    prompt_tokens_target: int | None
    max_tokens: int
    requests: int
    requests_ok: int
    requests_failed: int
    early_stop: int
    kv_exhausted: int
    errors: dict[str, int]
    wall_s: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    ttft_mean_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    itl_mean_s: float | None
    tpot_mean_s: float | None
    tpot_p99_s: float | None
    tpot_p50_s: float | None
    e2e_mean_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    decode_tok_s_mean: float | None
    decode_tok_s_p50: float | None
    server_decode_tok_s_mean: float | None
    output_tok_s: float | None
    requests_per_s: float | None
    # One count when every request had the same, else the sorted distinct counts.
    prompt_tokens: int | list[int]
    completion_tokens: int | list[int]
    cached_tokens_mean: float | None
    output_tokens_total: int
    # The run's context; `model` is left out of --workers runs (the parent never sees it),
    # `workers` is only in them, `server` only with a probe.
    kind: str = ""
    endpoint: str = ""
    cache: str = ""
    model: str | Literal[Absent.ABSENT] | None = ABSENT
    workers: int | None = None
    server: ServerFigures | None = None
    valid: bool = True
    invalid_reasons: list[str] | None = None
    # --traffic only: how late the scheduled sends went out (p99, worst, the count later than
    # LATE_SEND_S; never shifted), and the requests whose prompt differs from the traffic's.
    send_error_p99_s: float | None = None
    send_error_max_s: float | None = None
    late_sends: int | None = None
    prompt_tokens_off: int | None = None
    prompt_tokens_off_max: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The summary.json row (keys that do not apply are left out, not null)."""
        out = {name: getattr(self, name) for name in _FIELDS}
        for name, unset in _OMITTED_WHEN.items():
            if out[name] is unset:
                del out[name]
        return out


_FIELDS = tuple(f.name for f in fields(StepSummary))
_OMITTED_WHEN: dict[str, Any] = {
    "model": ABSENT,
    "workers": None,
    "server": None,
    "invalid_reasons": None,
    "send_error_p99_s": None,
    "send_error_max_s": None,
    "late_sends": None,
    "prompt_tokens_off": None,
    "prompt_tokens_off_max": None,
}
# A scheduled send later than this counts as late (issue 34's bound: 5 ms at p99).
LATE_SEND_S = 0.005


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _one_or_all(counts: Iterable[int | None]) -> int | list[int]:
    distinct = sorted({c for c in counts if c is not None})
    return distinct[0] if len(distinct) == 1 else distinct


# The statistics columns: (field, series, percentile or None for the mean, digits kept).
_STATISTICS: tuple[tuple[str, str, float | None, int], ...] = (
    ("ttft_p50_s", "ttft", 50, 6), ("ttft_p90_s", "ttft", 90, 6), ("ttft_p99_s", "ttft", 99, 6),
    ("ttft_mean_s", "ttft", None, 6),
    ("itl_p50_s", "itl", 50, 6), ("itl_p99_s", "itl", 99, 6), ("itl_mean_s", "itl", None, 6),
    ("tpot_mean_s", "tpot", None, 6), ("tpot_p99_s", "tpot", 99, 6), ("tpot_p50_s", "tpot", 50, 6),
    ("e2e_mean_s", "e2e", None, 6), ("e2e_p50_s", "e2e", 50, 6), ("e2e_p99_s", "e2e", 99, 6),
    ("decode_tok_s_mean", "decode", None, 3), ("decode_tok_s_p50", "decode", 50, 3),
    ("server_decode_tok_s_mean", "server_decode", None, 3),
)  # fmt: skip


def _series(ok: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """The per-request (per-gap for `itl`) values each statistic is taken over."""
    return {
        "ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
        "itl": [g for r in ok for g in r.itls],
        "tpot": [r.tpot_s for r in ok if r.tpot_s is not None],
        "e2e": [r.e2e_s for r in ok],
        "decode": [r.decode_tok_s for r in ok if r.decode_tok_s is not None],
        "server_decode": [
            r.server_predicted_per_second for r in ok if r.server_predicted_per_second is not None
        ],
    }


def summarize(
    records: Iterable[RequestRecord],
    *,
    engine: str,
    step: int,
    concurrency: int | None,
    rate: float | None,
    prompt_tokens_target: int | None,
    max_tokens: int,
    wall_s: float,
) -> StepSummary:
    """The statistics of one engine in one step (the run's context left at its defaults)."""
    recs = list(records)
    ok = [r for r in recs if r.error is None]
    errors: dict[str, int] = {}
    for r in recs:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    series = _series(ok)
    # Any: mypy cannot match a mapping's keys to the fields; each is `float | None`.
    statistics: dict[str, Any] = {
        name: _round(mean(series[key]) if q is None else percentile(series[key], q), digits)
        for name, key, q, digits in _STATISTICS
    }
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    cached = [float(r.cached_tokens) for r in ok if r.cached_tokens is not None]
    return StepSummary(
        engine=engine,
        step=step,
        concurrency=concurrency,
        rate=rate,
        prompt_tokens_target=prompt_tokens_target,
        max_tokens=max_tokens,
        requests=len(recs),
        requests_ok=len(ok),
        requests_failed=len(recs) - len(ok),
        early_stop=errors.get(EARLY_STOP, 0),
        kv_exhausted=errors.get(KV_EXHAUSTED, 0),
        errors=errors,
        wall_s=_round(wall_s),
        output_tok_s=_round(out_tokens / wall_s, 3) if wall_s > 0 else None,
        requests_per_s=_round(len(ok) / wall_s, 3) if wall_s > 0 else None,
        prompt_tokens=_one_or_all(r.prompt_tokens for r in recs),
        completion_tokens=_one_or_all(r.completion_tokens for r in recs),
        cached_tokens_mean=_round(mean(cached), 2),
        output_tokens_total=out_tokens,
        **statistics,
        **_traffic_figures(recs),
    )


def _traffic_figures(recs: Sequence[RequestRecord]) -> dict[str, Any]:
    """--traffic's send errors and prompt-length differences (nothing for other runs)."""
    out: dict[str, Any] = {}
    errors = [r.send_error_s for r in recs if r.send_error_s is not None]
    if errors:
        out["send_error_p99_s"] = _round(percentile(errors, 99))
        out["send_error_max_s"] = _round(max(errors))
        out["late_sends"] = sum(1 for e in errors if e > LATE_SEND_S)
    offs = [d for r in recs if (d := prompt_tokens_off(r)) is not None]
    if offs:
        out["prompt_tokens_off"] = sum(1 for d in offs if d)
        out["prompt_tokens_off_max"] = max(offs, key=abs)
    return out


def engine_summary(
    records: Sequence[RequestRecord],
    spec: RunSpec,
    target: Target,
    *,
    step: int,
    wall_s: float,
    model: str | Literal[Absent.ABSENT] | None = ABSENT,
    workers: int | None = None,
    server: ServerFigures | None = None,
) -> StepSummary:
    """The summary of `target` in one step of `spec` (one process or merged workers)."""
    summary = summarize(
        records,
        engine=target.name,
        step=step,
        concurrency=spec.concurrency,
        rate=spec.rate,
        prompt_tokens_target=spec.prompt_tokens if spec.prompt_text is None else None,
        max_tokens=spec.max_tokens,
        wall_s=wall_s,
    )
    summary.kind, summary.endpoint, summary.cache = target.kind, spec.endpoint, spec.cache
    summary.model, summary.workers, summary.server = model, workers, server
    return summary


def concerns(reason: str, engine: str) -> bool:
    """Whether a step reason names this engine (reasons about the whole step concern all)."""
    return (
        f"{engine}:" in reason
        or f"{engine} vs " in reason
        or f" vs {engine}" in reason
        or (reason.startswith("aborted:"))
    )


def mark_validity(
    summaries: Sequence[StepSummary], reasons: Sequence[str], per_engine: bool = True
) -> None:
    """Set each summary's validity from its step's reasons (and the ones naming its engine)."""
    for summary in summaries:
        summary.valid = not reasons
        if per_engine:
            summary.invalid_reasons = [r for r in reasons if concerns(r, summary.engine)]


@dataclass
class RunSummary:
    """The summary.json document of a run."""

    valid: bool
    invalid_reasons: list[str]
    aborted: bool
    abort_reason: str | None
    interrupted: bool
    tool_version: str
    run: dict[str, Any]
    steps: list[StepSummary] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """summary.json as a JSON-ready mapping."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["steps"] = [s.to_dict() for s in self.steps]
        return out


@dataclass
class StepResult:
    """What one step produced: summaries and records per engine, and the verification."""

    step: int
    spec: RunSpec
    summaries: list[StepSummary]
    records: dict[str, list[RequestRecord]]
    reasons: list[str]
    interrupted: bool = False
    # The step stopped before its planned end (engine gone, too many errors, deadline,
    # interrupted); `abort_reason` says which and why.
    aborted: bool = False
    abort_reason: str | None = None

    @property
    def valid(self) -> bool:
        return not self.reasons and not self.aborted


def build_summary(
    steps: Sequence[StepResult],
    run_info: dict[str, Any],
    interrupted: bool = False,
    abort_reason: str | None = None,
) -> RunSummary:
    """The summary of a run.

    `aborted` is true when the run stopped before its plan ended (engine gone, too many
    errors, a deadline, a signal, an unreachable target); `abort_reason` says why. An aborted
    run is never valid.
    """
    reasons = [f"step {s.step}: {r}" for s in steps for r in s.reasons]
    if abort_reason is not None and not any(s.aborted for s in steps):
        reasons.append(f"aborted: {abort_reason}")
    return RunSummary(
        valid=not reasons,
        invalid_reasons=reasons,
        aborted=abort_reason is not None,
        abort_reason=abort_reason,
        interrupted=interrupted,
        tool_version=tool_version(),
        run=run_info,
        steps=[summary for s in steps for summary in s.summaries],
    )


def tool_version() -> str:
    """The installed llm-bottleneck version (\"unknown\" when run from a bare checkout)."""
    try:
        return metadata.version("llm-bottleneck")
    except metadata.PackageNotFoundError:
        return "unknown"


__all__ = [
    "ABSENT",
    "RunSummary",
    "StepResult",
    "StepSummary",
    "build_summary",
    "engine_summary",
    "mark_validity",
    "summarize",
    "tool_version",
]
